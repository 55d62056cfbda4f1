"""Tables a person reads, at any width (80 columns in a log file, CI, a narrow terminal).

Every column folds (wraps, and splits a word longer than the column) instead of cutting
a cell to "…"; every cell and title is text, never markup (cli_text.cell). What does not
fit a cell whole (an error with a key fingerprint) is printed below the table by the
caller, as wrapped lines (``notes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ddtree_deploy.cli.text import cell, plain


def make_table(title: str, columns: Sequence[str]) -> Table:
    table = Table(title=Text(plain(title)))
    for col in columns:
        table.add_column(Text(col), overflow="fold")
    return table


def add_row(table: Table, *cells: str | Text | None) -> None:
    """A row; plain strings become text cells (never parsed as markup)."""
    table.add_row(*(c if isinstance(c, Text) else cell(c or "") for c in cells))


def notes(lines: Iterable[tuple[str, str]]) -> list[RenderableType]:
    """``(who, text)`` pairs printed under a table, each whole and wrapped at words (a text
    that already starts with its host's name is not given it twice)."""
    out: list[RenderableType] = []
    for who, text in lines:
        if text.startswith(who):
            who, text = text[: len(who)], text[len(who):].removeprefix(":").lstrip()
        out.append(Text.assemble((plain(who), "bold"), " ", plain(text)) if text.startswith("(")
                   else Text.assemble((plain(who), "bold"), ": ", plain(text)))
    return out
