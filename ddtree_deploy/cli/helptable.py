"""Help's option tables with every option name whole, at any width the CLI runs at.

typer draws a command's options as a rich ``Table`` (``typer.rich_utils``) whose columns are
rich's defaults: where the terminal is narrow (60 columns) or a name long
(``--mem-fraction-static``), rich narrows every column alike and cuts a name with "…". While a
help page is written, the table typer makes is :class:`WholeNames`: its name columns (all but
the label and help columns, the last two) are not narrowed to make room while the label and
help keep HELP_ROOM columns (at 60 columns and more for this CLI's names), the label and help
wrap, and a word longer than its column folds onto the next line instead of being cut.
Imported only when help is shown (typer's rich_utils takes a tenth of a second to import).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

WORDS_AFTER_NAMES = 2  # typer's options table ends with the value's label and the help
PADDING = 2  # typer's cell padding, (0, 1)
HELP_ROOM = 24  # columns the label and the help need beside whole names


class WholeNames(Table):
    """typer's options table (built with ``Table(...)`` and ``add_row`` alone); a table that
    declares its columns (typer's command list) is left as it is."""

    options: bool | None = None  # set at the first row: whether typer declared no column
    names_width = 0  # the widest row's names with their columns' padding

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        if self.options is None:
            self.options = not self.columns
        if not self.options:
            super().add_row(*renderables, **kwargs)
            return
        for cell in renderables:  # the help is a Columns of texts: each folds a long word
            for text in getattr(cell, "renderables", [cell]):
                if isinstance(text, Text) and text.overflow is None:
                    text.overflow = "fold"
        names = renderables[:-WORDS_AFTER_NAMES]
        self.names_width = max(self.names_width, sum(
            (cell.cell_len if isinstance(cell, Text) else 0) + PADDING for cell in names))
        super().add_row(*renderables, **kwargs)
        for column in self.columns:
            column.overflow = "fold"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # The names keep their width while that leaves the label and help room to be read;
        # narrower (a 40-column terminal), a name folds onto a second line, never cut.
        whole = options.max_width - self.names_width >= HELP_ROOM
        for column in self.columns[:-WORDS_AFTER_NAMES] if self.options else ():
            column.no_wrap = whole
        yield from super().__rich_console__(console, options)


@contextlib.contextmanager
def whole_names() -> Iterator[None]:
    """typer draws its option tables as :class:`WholeNames` inside this block."""
    from typer import rich_utils

    drawn_with = rich_utils.Table
    rich_utils.Table = WholeNames  # type: ignore[misc]
    try:
        yield
    finally:
        rich_utils.Table = drawn_with  # type: ignore[misc]
