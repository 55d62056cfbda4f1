"""Text from a results file made inert in each format the report writes.

A label, workload or flag comes from a file anyone may have edited: it is shown as the text
it is, never read as markup. First every character that could end a line or reach a
terminal raw (C0 and C1 controls, U+2028/2029, bidirectional overrides) is shown as an
escape (``\\x0a``): a newline would end a LaTeX comment or a Markdown table row. Then:

- `md`: the characters that open inline markup backslash-escaped (`\\ ` * _ [ ] < > & | ~ $`:
  HTML, links and images, emphasis, code, entities, table cells, strikethrough, math),
  so no `<img onerror=...>`, link, emphasis or table cell can form (the text is never at
  a line's start, where block markup would begin);
  `md_code`: a code span fenced by more backticks than the text holds;
- `html`: `html.escape` with quotes;
- `tex`: LaTeX's special characters as their text commands;
- `mpl`: matplotlib's text with `$` escaped, so no math text is parsed (an odd `$` or
  `$\\foo$` would raise while the chart is drawn);
- `csv_cell`: text a spreadsheet would run as a formula (`=`, `+`, `-`, `@` first) gets a
  leading `'`; numbers are left as they are.
"""

from __future__ import annotations

import html as _html
import re
import unicodedata

_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")
_MD_SPECIAL = frozenset("\\`*_[]<>&|~$")
_TEX = {"\\": "\\textbackslash{}", "&": "\\&", "%": "\\%", "$": "\\$", "#": "\\#", "_": "\\_",
        "{": "\\{", "}": "\\}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}",
        "<": "\\textless{}", ">": "\\textgreater{}", "|": "\\textbar{}"}


def visible(value: object) -> str:
    """The text with every line-ending, control or direction-changing character escaped."""
    out = []
    for ch in str(value):
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp", "Cs") or ch in _BIDI:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def md(value: object) -> str:
    return "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in visible(value))


def md_code(value: object) -> str:
    text = visible(value)
    runs = [len(m) for m in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def html(value: object) -> str:
    return _html.escape(visible(value), quote=True)


def tex(value: object) -> str:
    return "".join(_TEX.get(ch, ch) for ch in visible(value))


def mpl(value: object) -> str:
    return visible(value).replace("$", "\\$")


def csv_cell(value: object) -> object:
    if isinstance(value, str):
        text = visible(value)
        return "'" + text if text[:1] in ("=", "+", "-", "@") else text
    return value
