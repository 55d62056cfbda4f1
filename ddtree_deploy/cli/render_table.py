"""Tables a person reads, at any width (80 columns in a log file, CI, a narrow terminal).

``show`` prints them: on a terminal as rich tables, folded to its width (``--wide``: at their
natural width, nothing folded); to a pipe or a file as plain rows (as gh does), one row a line,
cells tab-separated, a cell's lines joined with "; ", the title and the column names as
``#`` lines: paths, commands and fingerprints are never cut, `cut -f` and `grep` work.

On a terminal every column folds (wraps, and splits a word longer than the column) instead
of cutting a cell to "…"; every cell and title is text, never markup (cli_text.cell). What does not
fit a cell whole (an error with a key fingerprint) is printed below the table by the
caller, as wrapped lines (``notes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Console, RenderableType
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


def plain_rows(table: Table) -> list[str]:
    """The table as plain lines: ``# title``, ``# column<TAB>column``, then one line a row."""
    def text(value: object) -> str:
        value = value.plain if isinstance(value, Text) else plain(value)
        return "; ".join(line.strip() for line in value.splitlines() if line.strip()) \
            .replace("\t", " ")

    lines = [f"# {text(table.title)}"] if table.title else []
    lines.append("# " + "\t".join(text(c.header) for c in table.columns))
    columns = [list(c.cells) for c in table.columns]
    for row in zip(*columns, strict=True):
        lines.append("\t".join(text(value) for value in row))
    return lines


def show(con: Console, *items: RenderableType, wide: bool = False) -> None:
    """Print tables (and the notes under them): plain rows when not on a terminal, else rich
    tables folded to the terminal's width, or at their natural width with ``wide``."""
    from ddtree_deploy.cli.common import is_tty, raw_stream

    terminal = is_tty(con)
    for item in items:
        if isinstance(item, Table) and not terminal:
            stream = raw_stream(con)
            stream.write("\n".join(plain_rows(item)) + "\n")
            stream.flush()
        elif isinstance(item, Table) and wide:
            from rich.measure import Measurement
            from rich.segment import Segments

            # rendered at the table's own width, then printed as is (a terminal narrower
            # than the table wraps the lines; a copy of a cell gets it whole)
            natural = Measurement.get(con, con.options.update_width(1 << 16), item).maximum
            options = con.options.update_width(max(natural, con.width))
            con.print(Segments(con.render(item, options)), crop=False)
        elif not terminal and isinstance(item, Text):
            stream = raw_stream(con)
            stream.write(item.plain + "\n")
            stream.flush()
        else:
            con.print(item)
