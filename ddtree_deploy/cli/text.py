"""Text from outside (hosts, files, the command line) made safe to print.

Everything a host, a file or the user gave is printed as text, never as rich markup
(``[/x]`` in a path would crash rich, ``[bold]`` would restyle it), and its control
characters are shown escaped (``\\x1b``) so that no ESC sequence from a host reaches
the terminal. Newlines and tabs are kept: they lay out multi-line messages and cells.

- ``plain(value)``: the text with control characters escaped (for markup=False output,
  files, JSON-free plain text);
- ``esc(value)``: the same, also escaped for embedding in a markup string;
- ``cell(value, style)``: a rich Text (never parsed as markup) for tables.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

# C0/C1 controls (not newline or tab), the line and paragraph separators a terminal or a
# log reader may break a line at, and bidirectional overrides (text shown reordered).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                      "\u200e\u200f]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: object) -> str:
    """``str(value)`` with control characters (not newline or tab), U+2028/2029 and
    bidirectional overrides as ``\\xNN`` / ``\\uNNNN``."""
    return _CONTROL.sub(_escaped, str(value))


def esc(value: object) -> str:
    """``plain(value)`` escaped for a rich markup string: printed exactly as it reads."""
    from rich.markup import escape

    return escape(plain(value))


def cell(value: object, style: str = "") -> Text:
    """A table cell (or any renderable text) that rich never parses as markup."""
    from rich.text import Text

    return Text(plain(value), style=style)
