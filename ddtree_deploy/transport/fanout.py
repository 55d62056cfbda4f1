"""Run one function per host in parallel; successes and failures come back as data.

A failing host never hides the others: each outcome is kept with its error, and
the exit code says whether all, some or none succeeded. The workers are daemon threads: Ctrl-C
in the caller ends the command at once, never after the slowest host's connect or command
timeout (the threads of a thread pool would be joined at exit, and its queued hosts still
served).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ddtree_deploy.errors import DeployError, ExitCode

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    host: str
    value: T | None = None
    error: DeployError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(
    hosts: Iterable[str], fn: Callable[[str], T], *, concurrency: int = 8
) -> list[Outcome[T]]:
    """fn(host) for every host, at most `concurrency` at once, in the hosts' order."""
    names = list(hosts)

    def one(host: str) -> Outcome[T]:
        try:
            return Outcome(host, value=fn(host))
        except DeployError as exc:
            return Outcome(host, error=exc)
        except OSError as exc:  # a library error that escaped its boundary: still data
            return Outcome(host, error=DeployError(f"{host}: {exc}"))

    if not names:
        return []
    outcomes: list[Outcome[T] | None] = [None] * len(names)
    bugs: list[BaseException] = []  # anything else is a bug: raised in the caller, as map does
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(names)):
        todo.put(index)

    def work() -> None:
        while not bugs:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            try:
                outcomes[index] = one(names[index])
            except BaseException as exc:  # handed to the caller below
                bugs.append(exc)

    workers = [threading.Thread(target=work, name=f"fan-out-{n}", daemon=True)
               for n in range(max(1, min(concurrency, len(names))))]
    for worker in workers:
        worker.start()
    for worker in workers:
        # Ctrl-C raises here and leaves the daemon workers behind. Bounded waits: a SIGINT that
        # lands just before a lock wait blocks is not seen by it (CPython), only at the next turn
        while worker.is_alive():
            worker.join(0.2)
    if bugs:
        raise bugs[0]
    return [outcome for outcome in outcomes if outcome is not None]


def exit_code(outcomes: list[Outcome[T]]) -> ExitCode:
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return ExitCode.OK
    if len(failed) == len(outcomes):
        codes = {o.error.exit_code for o in failed if o.error is not None}
        return codes.pop() if len(codes) == 1 else ExitCode.FAILED
    return ExitCode.PARTIAL
