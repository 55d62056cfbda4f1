"""Checking timeouts without a wall-clock bound.

A test of a timeout asserts what the timeout must do (the call raises or reports it, the
process it started no longer exists) and makes the would-be hang long (minutes). The only
clock left is a hang guard: a limit far beyond any normal run, so that a broken timeout
fails the test with a clear message instead of blocking the suite. It is not a performance
bound: a loaded machine never comes near it. $DDTREE_TEST_HANG_GUARD_S shortens it (for
checking, with the code under test broken on purpose, that a test fails).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import pytest

HANG_GUARD_S = float(os.environ.get("DDTREE_TEST_HANG_GUARD_S", "300"))
T = TypeVar("T")


def call_guarded(fn: Callable[[], T], what: str, limit: float = HANG_GUARD_S) -> T:
    """fn()'s result (or its exception, raised here), run in a thread; a call still running
    after `limit` s fails the test (a hang guard)."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        pytest.fail(f"hang guard: {what} still running after {limit:g}s: its timeout was not "
                    "enforced")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def gone(pid: int) -> bool:
    """No process `pid` runs any more (none, or a zombie waiting for its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def kill_left(pids: Iterable[int]) -> None:
    """Clean-up: SIGKILL any of `pids` still running (only ever a failed test's)."""
    for pid in pids:
        if not gone(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def running(token: str) -> list[int]:
    """The PIDs of running processes (not this one) whose command line contains `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            words = (entry / "cmdline").read_bytes().replace(b"\0", b" ")  # as pgrep -f
            if token.encode() in words and not gone(int(entry.name)):
                found.append(int(entry.name))
    return found


def wait_none_running(token: str, what: str, limit: float = HANG_GUARD_S) -> None:
    """Return once no process with `token` in its command line runs (a kill's delivery is
    not instant); one still running after `limit` s (a hang guard) fails the test."""
    deadline = time.monotonic() + limit
    while left := running(token):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: process(es) {left} with {token!r} still running after "
                        f"{limit:g}s: the timeout did not kill them")
        time.sleep(0.05)


def children(parent: int) -> set[int]:
    """The PIDs whose parent is `parent` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent and fields[0] not in ("Z", "X"):
                found.add(int(entry.name))
    return found
