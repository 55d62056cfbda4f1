"""What apply shows on stderr while it runs, and its summary's per-step seconds.

On a terminal: a live status line per host (its step, the seconds it has run, the last
line its command printed) with the lane copy's byte bars under it, redrawn in place; each
step is said as a line when it begins and when it ends (`host: KIND TITLE done in 12.3s`).
Elsewhere (a pipe, a log file): those lines only, plain: no bars, no control codes; a step
that runs on is said again every HEARTBEAT_S seconds with its command's last line.
-v adds each command sent (`host: $ COMMAND (exit 0, 1.2s)`), -vv the lines it prints as
they come (`host:   err| LINE`), whole but for lines cut at LINE_SHOWN characters. Secret
values are masked by the transport before anything reaches this module.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ddtree_deploy.cli.text import plain

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

    from ddtree_deploy.converge.runner import HostRun
    from ddtree_deploy.converge.steps import Step
    from ddtree_deploy.overlay.progress import ProgressSink, RichProgress
    from ddtree_deploy.transport.base import Observer
    from ddtree_deploy.transport.live import Listener

LINE_SHOWN = 400  # -vv: a longer output line (a script's JSON answer) is cut here
HEARTBEAT_S = 30.0  # off a terminal, a running step is said again this often


def seconds(value: float) -> str:
    """A duration as the summary says it: 0.4s, 12.3s, 4m05s."""
    if value < 60:
        return f"{value:.1f}s"
    m, s = divmod(int(round(value)), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m{s:02d}s"


class _StepBars:
    """One host's bars (its lane copy's fetch from the source host too), taken off the
    display when its step ends."""

    def __init__(self, bars: RichProgress) -> None:
        self._bars = bars
        self.tasks: list[int] = []

    def begin(self, host: str, what: str, total: int) -> int:
        task = self._bars.begin(host, what, total)
        self.tasks.append(task)
        return task

    def advance(self, task: int, nbytes: int) -> None:
        self._bars.advance(task, nbytes)

    def end(self, task: int) -> None:
        self._bars.end(task)

    def host(self, task: int) -> str:
        return self._bars.host(task)


class _Status:
    def __init__(self, text: str, started: float) -> None:
        self.text = text
        self.started = started
        self.said = started  # off a terminal: when a line last said the step still runs
        self.last = ""


class ApplyView:
    """apply's `Watch` (converge/runner.py), its -v observer and its output listener. Use as a
    context: on a terminal it draws the live part while open."""

    def __init__(self, console: Console, *, verbose: int, terminal: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._con = console
        self._clock = clock
        self.verbose = verbose
        self.terminal = terminal
        self._lock = threading.Lock()
        self._status: dict[str, _Status] = {}
        self._live: Any = None
        self._bars: Any = None
        self._drawn: dict[str, _StepBars] = {}
        self._noted: dict[str, str] = {}
        self._headed: dict[str, str] = {}  # -vv: the command whose output is being shown
        self.progress: RichProgress | None = None  # the lane copy's bars (a terminal only)
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> ApplyView:
        if not self.terminal:  # a log file: a line every HEARTBEAT_S while a step runs
            self._ticker = threading.Thread(target=self._tick_on, daemon=True)
            self._ticker.start()
        if self.terminal:
            from rich.live import Live

            from ddtree_deploy.overlay.progress import RichProgress, byte_bars

            self._bars = byte_bars(self._con)
            self.progress = RichProgress(self._con, drawn=self._bars)
            self._live = Live(get_renderable=self.live_part, console=self._con,
                              refresh_per_second=4,
                              transient=True, redirect_stdout=sys.stdout.isatty(),
                              redirect_stderr=False)
            self._live.start()
        return self

    def live_part(self) -> Any:
        """What is redrawn in place on a terminal: the status lines, then the bars."""
        from rich.console import Group

        return Group(self, *(() if self._bars is None else (self._bars,)))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _tick_on(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    def tick(self) -> None:
        """Off a terminal: each step running for HEARTBEAT_S more since it was last said is
        said again, with its seconds and the last line its command printed."""
        now = self._clock()
        due: list[tuple[str, str, float, str]] = []
        with self._lock:
            for host, s in sorted(self._status.items()):
                if now - s.said >= HEARTBEAT_S:
                    s.said = now
                    due.append((host, s.text, now - s.started, s.last))
        for host, text, took, last in due:
            self.say(f"{host}: {text} running for {seconds(took)}"
                     + (f": {last.strip()}" if last.strip() else ""))

    def progress_for(self, host: str) -> ProgressSink | None:
        """The bars the host's steps draw (None off a terminal: no bars there)."""
        if self.progress is None:
            return None
        with self._lock:
            return self._drawn.setdefault(host, _StepBars(self.progress))

    def say(self, line: str) -> None:
        """One line of text (host text: never markup), above the live part on a terminal."""
        self._con.print(plain(line), markup=False, highlight=False, soft_wrap=True)

    # -- Watch ----------------------------------------------------------------

    def began(self, host: str, step: Step, text: str) -> None:
        with self._lock:
            self._status[host] = _Status(f"{step.kind} {step.title}", self._clock())
        self.say(f"{host}: {text}")

    def ended(self, host: str, step: Step, seconds_: float, ok: bool) -> None:
        with self._lock:
            self._status.pop(host, None)
            self._noted.pop(host, None)
            drawn = self._drawn.get(host)
            tasks = list(drawn.tasks) if drawn is not None else []
            if drawn is not None:
                drawn.tasks.clear()
        if self.progress is not None and tasks:
            self.progress.remove(tasks)
        how = "done" if ok else "failed"
        self.say(f"{host}: {step.kind} {step.title} {how} in {seconds(seconds_)}")

    def note(self, host: str, text: str) -> None:
        """A step's word on where it stands: on the status line; said as a line when it
        changes, off a terminal or at -v."""
        with self._lock:
            status = self._status.get(host)
            if status is not None:
                status.last = text
            new = self._noted.get(host) != text
            self._noted[host] = text
        if new and (self.verbose >= 1 or not self.terminal):
            self.say(f"{host}: {text}")

    # -- what the transport tells -----------------------------------------------

    def observer(self, host: str) -> Observer:
        """-v: each command as it ends, with its exit and seconds."""

        def shown(command: str, code: int | None, took: float, _out: str, _err: str) -> None:
            exit_ = "killed at its deadline" if code is None else f"exit {code}"
            with self._lock:
                headed = self._headed.pop(host, None) == command
            if headed:  # -vv said it above its output: its end only
                self.say(f"{host}:   ({exit_}, {took:.1f}s)")
            else:
                self.say(f"{host}: $ {command} ({exit_}, {took:.1f}s)")

        return shown

    def listener(self, host: str) -> Listener:
        """Each line a command prints: -vv shows it; on a terminal the status line keeps
        the last one."""

        def heard(command: str, stream: str, line: str) -> None:
            if len(line) > LINE_SHOWN:
                line = f"{line[:LINE_SHOWN]} [... {len(line) - LINE_SHOWN} more characters]"
            with self._lock:
                status = self._status.get(host)
                if status is not None:
                    status.last = line
            if self.verbose >= 2:
                with self._lock:  # a host's commands run one after the other
                    head = self._headed.get(host) != command
                    self._headed[host] = command
                if head:
                    self.say(f"{host}: $ {command}")
                self.say(f"{host}:   {stream}| {line}")

        return heard

    def listeners(self, host: str) -> tuple[Listener, ...]:
        """What the host's transport tells as output comes (the status line's last line,
        -vv's lines)."""
        return (self.listener(host),)

    # -- the live part --------------------------------------------------------------

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.text import Text

        with self._lock:
            shown = [(h, s.text, self._clock() - s.started, s.last)
                     for h, s in sorted(self._status.items())]
        for host, text, took, last in shown:
            line = Text(plain(f"{host}: {text} ({took:.0f}s)"), no_wrap=True,
                        overflow="ellipsis")
            if last:
                line.append(plain(f"  {last.strip()}"), style="dim")
            yield line


def failure_output(host: str, exc: BaseException) -> list[str]:
    """-vv under a failed host: what the command that failed printed on stderr, whole (as
    bounded by Result.error_output), where the error's message keeps only its last lines."""
    from ddtree_deploy.errors import output_of

    text = output_of(exc)
    if not text:
        return []
    return [f"{host}: the failed command's stderr:",
            *(f"{host}:   err| {line}" for line in text.splitlines())]


def summary(run: HostRun) -> list[str]:
    """Each step's seconds, then the total: the lines under a converged host."""
    width = max((len(kind) for kind, _t, _s in run.timings), default=0)
    lines = [f"  {seconds(took):>8}  {kind:<{width}}  {title}"
             for kind, title, took in run.timings]
    if run.timings:
        lines.append(f"  {seconds(run.total_s):>8}  in all")
    return lines
