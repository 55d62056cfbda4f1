"""Progress of byte transfers, one bar per host (bytes, rate, ETA), or none at all.

Transfers talk to a `ProgressSink`: begin a task with its total, advance it by the
bytes moved (from any thread), end it. `RichProgress` draws rich bars on stderr;
`NullProgress` draws nothing; `CountingProgress` records totals (for tests).

In a pipelined transfer (overlay/relay.py) every host has its own bar at once: the
source's "fetch" and each target's "push (streamed)" advance together, by the file
bytes the workstation has verified into its cache; each target's receiver has been
handed those bytes already (they go to it first) and is at most its pipe and its
connection's buffers behind. A target served from the cache has a "push" bar of its
own. Rate and ETA are per bar, so a slow target shows as one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ddtree_deploy.cli.text import plain

if TYPE_CHECKING:
    from rich.console import Console


class ProgressSink(Protocol):
    def begin(self, host: str, what: str, total: int) -> int: ...

    def advance(self, task: int, nbytes: int) -> None: ...

    def end(self, task: int) -> None: ...

    def host(self, task: int) -> str: ...


class _Hosts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hosts: dict[int, str] = {}
        self._next = 0

    def _add(self, host: str) -> int:
        with self._lock:
            self._next += 1
            self._hosts[self._next] = host
            return self._next

    def host(self, task: int) -> str:
        return self._hosts.get(task, "?")


class NullProgress(_Hosts):
    def begin(self, host: str, what: str, total: int) -> int:
        return self._add(host)

    def advance(self, task: int, nbytes: int) -> None:
        return None

    def end(self, task: int) -> None:
        return None


class CountingProgress(_Hosts):
    """Records per task: host, what, total, bytes advanced, whether it ended."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: dict[int, dict[str, object]] = {}

    def begin(self, host: str, what: str, total: int) -> int:
        task = self._add(host)
        self.tasks[task] = {"host": host, "what": what, "total": total, "done": 0, "ended": False}
        return task

    def advance(self, task: int, nbytes: int) -> None:
        with self._lock:
            self.tasks[task]["done"] = int(self.tasks[task]["done"]) + nbytes  # type: ignore[call-overload]

    def end(self, task: int) -> None:
        self.tasks[task]["ended"] = True


def byte_bars(console: Console | None = None) -> Any:
    """The rich Progress the bars are drawn with (not started: the caller draws it, inside a
    live display of its own, or starts it)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("{task.description}", markup=False),  # host names: text
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console or Console(stderr=True, emoji=False),
        transient=False,
    )


class RichProgress(_Hosts):
    """Rich bars on stderr: `host what  [bar]  done/total  rate  eta`. Use as a context.
    `drawn`: a Progress (byte_bars) that a live display of the caller's already draws."""

    def __init__(self, console: Console | Callable[[], Console] | None = None, *,
                 drawn: Any = None) -> None:
        super().__init__()
        self._console = console
        self._progress: Any = drawn  # made at the first bar: a run that moves nothing loads
        self._ids: dict[int, Any] = {}  # no rich at all
        self._made = threading.Lock()

    def _bars(self) -> Any:
        with self._made:
            if self._progress is None:
                con = self._console() if callable(self._console) else self._console
                self._progress = byte_bars(con)
                self._progress.start()
            return self._progress

    def remove(self, tasks: list[int]) -> None:
        """Take these bars off the display (the step that drew them is over)."""
        for task in tasks:
            tid = self._ids.pop(task, None)
            if tid is not None and self._progress is not None:
                self._progress.remove_task(tid)

    def __enter__(self) -> RichProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def begin(self, host: str, what: str, total: int) -> int:
        task = self._add(host)
        self._ids[task] = self._bars().add_task(plain(f"{host} {what}"), total=total)
        return task

    def advance(self, task: int, nbytes: int) -> None:
        self._bars().advance(self._ids[task], nbytes)

    def end(self, task: int) -> None:
        tid, bars = self._ids[task], self._bars()
        bars.update(tid, completed=bars.tasks[tid].total or 0)
