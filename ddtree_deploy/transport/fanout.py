"""Run one function per host in parallel; successes and failures come back as data.

A failing host never hides the others: each outcome is kept with its error, and
the exit code says whether all, some or none succeeded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
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
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(names)))) as pool:
        return list(pool.map(one, names))


def exit_code(outcomes: list[Outcome[T]]) -> ExitCode:
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return ExitCode.OK
    if len(failed) == len(outcomes):
        codes = {o.error.exit_code for o in failed if o.error is not None}
        return codes.pop() if len(codes) == 1 else ExitCode.FAILED
    return ExitCode.PARTIAL
