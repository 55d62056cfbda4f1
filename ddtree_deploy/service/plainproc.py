"""A unit's command run as a plain process, for hosts without systemd (the H200 GPU host).

What runs is the `UnitCommand` the unit itself is written from (`render.unit_command`):
the same argv, Environment= and WorkingDirectory= systemd would run, taken from the model
and never parsed back from the unit's text (a second reader of the text is a second
opinion on what the unit means: Python splits lines and strips spaces where systemd
does not). Its environment is what systemd would give the unit's process
(`spec.unit_base_environment`: systemd's PATH, the user's HOME, USER, LOGNAME and SHELL, the
system's LANG), then the unit's Environment= and EnvironmentFile=: nothing else of the caller's.

`start` runs the command detached, in a session and process group of its own, with
stdin from /dev/null and stdout+stderr appended to a log file (what the probe reads
with `--pid/--log-file`), and returns its PID. A short launcher process starts it and
exits at once, so the server is nobody's child here (no zombie, no lingering handle)
and any process can stop it later by PID. `stop` mirrors the unit's KillMode=mixed:
SIGTERM to the main process, which stops its own children, then SIGKILL to whatever
is left of its process group after the timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.localproc import pid_alive
from ddtree_deploy.service.spec import UnitCommand

__all__ = ["PlainProcError", "UnitCommand", "group_alive", "start", "stop"]


class PlainProcError(DeployError):
    """A unit's command cannot be started or stopped as a plain process."""

    exit_code = ExitCode.FAILED


# The launcher: start argv in a new session with the log as stdout/stderr, print its PID, exit
# without waiting (the server is then reparented to init, or to the nearest subreaper).
_LAUNCHER = r"""
import json, os, stat, subprocess, sys
spec = json.loads(sys.stdin.read())
try:  # the log is appended to, never through a link planted where it goes
    fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                 | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError(0, "not a regular file", spec["log"])
    os.set_blocking(fd, True)
except OSError as exc:
    sys.stderr.write(f"log file: {exc.strerror or exc}: {spec['log']}\n")
    os._exit(1)
with open(os.devnull, "rb") as null, os.fdopen(fd, "ab", buffering=0) as log:
    try:
        p = subprocess.Popen(spec["argv"], cwd=spec["cwd"], env=spec["env"], stdin=null,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             close_fds=True)
    except OSError as exc:
        sys.stderr.write(f"{exc.strerror or exc}: {exc.filename or spec['argv'][0]}\n")
        os._exit(1)
    sys.stdout.write(f"{p.pid}\n")
    sys.stdout.flush()
    os._exit(0)
"""


def start(cmd: UnitCommand, log_path: str, *, base_env: Mapping[str, str] | None = None,
          timeout: float = 30.0) -> int:
    """Start `cmd` detached (own session/process group), output appended to `log_path`; its PID."""
    log_dir = os.path.dirname(os.path.abspath(log_path))
    if not os.path.isdir(log_dir):
        raise PlainProcError(f"log folder {log_dir} does not exist")
    if not os.path.isdir(cmd.cwd):
        raise PlainProcError(f"working directory {cmd.cwd} does not exist")
    spec = {"argv": list(cmd.argv), "cwd": cmd.cwd, "env": cmd.environment(base_env),
            "log": os.path.abspath(log_path)}
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER], input=json.dumps(spec),
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        raise PlainProcError(f"starting {cmd.argv[0]} took over {timeout:g} s") from None
    except OSError as exc:
        raise PlainProcError(f"cannot run the launcher: {exc}") from None
    if done.returncode != 0:
        raise PlainProcError(
            f"cannot start {cmd.argv[0]}: {done.stderr.strip() or f'exit {done.returncode}'}"
        )
    try:
        return int(done.stdout.strip())
    except ValueError:
        raise PlainProcError(f"the launcher answered {done.stdout!r}, not a PID") from None


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` still exists (zombies of init included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        raise PlainProcError(f"cannot signal process group {pgid}: {exc}") from None


def _reap(pid: int) -> None:
    """Collect `pid` if it happens to be a child of this process (else nothing to do)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _wait(check: Callable[[int], bool], pid: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        _reap(pid)
        if not check(pid):
            return True
        time.sleep(0.05)
    _reap(pid)
    return not check(pid)


def stop(pid: int, timeout: float = 30.0) -> bool:
    """Stop a process `start` made: SIGTERM to it, SIGKILL to its group after `timeout` s.

    Returns True when it stopped on SIGTERM alone, False when SIGKILL was needed. Only a
    process leading its own group (as `start` makes them) is signalled as a group; any
    other PID is refused, so a recycled PID of an unrelated process is never killed as a
    group.
    """
    if pid <= 1:
        raise PlainProcError(f"refusing to stop PID {pid}")
    if not pid_alive(pid):
        _reap(pid)
        if group_alive(pid):
            _signal_group(pid, signal.SIGKILL)
        return True
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return True
    if pgid != pid:
        raise PlainProcError(
            f"PID {pid} does not lead its own process group (group {pgid}); "
            "it was not started by ddtree-deploy's plain-process mode"
        )
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    clean = _wait(pid_alive, pid, time.monotonic() + timeout)
    # KillMode=mixed: whatever is left of the group (children that outlived the main process,
    # or everything after the timeout) is killed.
    if group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
        _wait(group_alive, pgid, time.monotonic() + 10.0)
    return clean
