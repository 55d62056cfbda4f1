"""The lab's own lock: one user of the lab per machine at a time.

The lab (containers, mounts, namespaces, the 10.77/16 range) is one per machine.
Two `lab up` at once tear down each other's containers and once wiped a running
container's root. So `lab up`, `lab down`, the test session's lab fixture and the
benchmarks that use the lab hold this lock (an flock on a file under /run/lock),
for as long as they need the lab. A second caller waits for it or is refused with
the holder's PID and command line, which the holder writes into the lock file.

Re-entrant down a process tree: a process whose own PID or an ancestor's is the
recorded holder goes on without locking (the test session's fixture holds the
lock, then a test calls `manager.up()` or runs `ddtree-deploy lab up` as a child).

The path is not /tmp/ddtree-lab-session.lock, which people use with flock(1) to
wrap whole sessions: holding that one never blocks this one, and the reverse.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ddtree_lab.errors import LabError

DEFAULT_PATH = Path("/run/lock/ddtree-deploy-lab.lock")
ENV_PATH = "DDTREE_LAB_LOCK"  # another path (tests use one of their own)


class LabBusyError(LabError):
    """Another process holds the lab."""


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    since: float

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"PID {self.pid} ({self.command}), since {when}"


def lock_path() -> Path:
    value = os.environ.get(ENV_PATH)
    return Path(value) if value and os.path.isabs(value) else DEFAULT_PATH


def _command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return "?"
    text = " ".join(" ".join(argv).split())  # one line
    return text if len(text) <= 240 else f"{text[:150]} ... {text[-85:]}"


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def ancestry(pid: int | None = None) -> list[int]:
    """`pid` (default: this process) and its ancestors up to PID 1."""
    chain = []
    cur = os.getpid() if pid is None else pid
    while cur > 0 and cur not in chain:
        chain.append(cur)
        cur = _parent_of(cur)
    return chain


def read_holder(path: Path) -> Holder | None:
    """The holder recorded in the lock file, or None when none is recorded (yet)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8") or "null")
        return Holder(int(raw["pid"]), str(raw["command"]), float(raw["since"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _open(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LabError(f"cannot open the lab lock {path}: {exc.strerror}") from exc


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise LabError(f"cannot lock the lab: {exc.strerror}") from exc


def _busy_holder(path: Path) -> Holder | None:
    """The holder while the lock is taken; re-read briefly while it is still writing."""
    for _ in range(20):
        holder = read_holder(path)
        if holder is not None:
            return holder
        time.sleep(0.05)
    return None


@contextlib.contextmanager
def hold(wait_s: float = 0.0, *, path: Path | None = None,
         waiting: Callable[[str], None] | None = None) -> Iterator[Holder]:
    """Hold the lab lock for the block; wait up to `wait_s` seconds for another holder.

    `waiting`, when given, is called once with the holder's description before
    waiting. Raises LabBusyError naming the holder when it still holds after wait_s.
    """
    path = path or lock_path()
    fd = _open(path)
    try:
        deadline = time.monotonic() + max(0.0, wait_s)
        told = False
        while not _try_flock(fd):
            holder = _busy_holder(path)
            if holder is not None and holder.pid in ancestry():
                yield holder  # held by this process or one above it: already ours
                return
            who = holder.describe() if holder else "a process that did not say who it is"
            if time.monotonic() >= deadline:
                raise LabBusyError(
                    f"the lab is in use by {who}",
                    hint="wait until it is done (or pass --wait SECONDS); "
                         f"lock file {path}")
            if not told and waiting is not None:
                waiting(who)
                told = True
            time.sleep(min(0.2, max(0.01, deadline - time.monotonic())))
        me = Holder(os.getpid(), _command_of(os.getpid()), time.time())
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": me.pid, "command": me.command,
                                  "since": me.since}).encode(), 0)
        try:
            yield me
        finally:
            os.ftruncate(fd, 0)  # released: nobody is recorded (before the flock goes)
    finally:
        os.close(fd)


def session(wait_s: float = 3600.0) -> contextlib.AbstractContextManager[Holder]:
    """Hold the lab for a whole run (a test session, a benchmark), saying whom it waits for."""
    return hold(wait_s, waiting=lambda who: print(f"lab: waiting for {who}", file=sys.stderr,
                                                  flush=True))
