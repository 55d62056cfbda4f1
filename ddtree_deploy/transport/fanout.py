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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from ddtree_deploy.errors import DeployError, ExitCode

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    host: str
    value: T | None = None
    error: DeployError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def parallel_map(fn: Callable[[A], R], items: Sequence[A], *, workers: int) -> list[R]:
    """fn(item) for every item, at most `workers` at once, the results in the items' order.
    An exception fn raises stops the items not yet begun and is raised here once the running
    ones end (as a thread pool's map). Ctrl-C raises here at once, leaving the daemon workers
    behind to end with their running item, never to begin a queued one (a thread pool would
    first wait for every running item, and serve the queued)."""
    if not items:
        return []
    results: list[R | None] = [None] * len(items)
    bugs: list[BaseException] = []
    stop = threading.Event()  # the caller is gone (Ctrl-C): begin no more items
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(items)):
        todo.put(index)

    def work() -> None:
        while not bugs and not stop.is_set():
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[index] = fn(items[index])
            except BaseException as exc:  # handed to the caller below
                bugs.append(exc)

    threads = [threading.Thread(target=work, name=f"parallel-{n}", daemon=True)
               for n in range(max(1, min(workers, len(items))))]
    try:  # Ctrl-C may land while the workers start, as well as while they are awaited
        for thread in threads:
            thread.start()
        for thread in threads:
            # Bounded waits: a SIGINT that lands just before a lock wait blocks is not seen
            # by it (CPython), only at the next turn
            while thread.is_alive():
                thread.join(0.2)
    except BaseException:
        stop.set()
        raise
    if bugs:
        raise bugs[0]
    return cast("list[R]", results)


def fan_out(
    hosts: Iterable[str], fn: Callable[[str], T], *, concurrency: int = 8
) -> list[Outcome[T]]:
    """fn(host) for every host, at most `concurrency` at once, in the hosts' order."""

    def one(host: str) -> Outcome[T]:
        try:
            return Outcome(host, value=fn(host))
        except DeployError as exc:
            return Outcome(host, error=exc)
        except OSError as exc:  # a library error that escaped its boundary: still data
            return Outcome(host, error=DeployError(f"{host}: {exc}"))

    return parallel_map(one, list(hosts), workers=concurrency)


def exit_code(outcomes: list[Outcome[T]]) -> ExitCode:
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return ExitCode.OK
    if len(failed) == len(outcomes):
        codes = {o.error.exit_code for o in failed if o.error is not None}
        return codes.pop() if len(codes) == 1 else ExitCode.FAILED
    return ExitCode.PARTIAL
