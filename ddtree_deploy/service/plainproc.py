"""A rendered unit run as a plain process, for hosts without systemd (the H200 GPU host).

`service render` produces the unit; this module reads back what systemd would run
from it -- ExecStart's argv, the Environment= assignments and WorkingDirectory= --
undoing the quoting of `render.py` (systemd.syntax(7): double or single quotes with
C escapes, `%%` for `%`, and in ExecStart `$$` for `$`). Anything the renderer never
writes and that only systemd could give a meaning to (another `%` specifier, a `$NAME`
reference, an ExecStart prefix such as `-` or `+`) is refused rather than guessed.

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
from dataclasses import dataclass, field

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.localproc import pid_alive

__all__ = ["PlainCommand", "PlainProcError", "group_alive", "start", "stop"]

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "s": " ",
            "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


class PlainProcError(DeployError):
    """A unit cannot be read as a command, or its process cannot be started."""

    exit_code = ExitCode.FAILED


class UnitParseError(PlainProcError):
    exit_code = ExitCode.USAGE


def _words(text: str, where: str) -> list[str]:
    """Split one directive's value into words as systemd does (quotes, C escapes)."""
    words: list[str] = []
    cur: list[str] = []
    in_word = False
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text):
                raise UnitParseError(f"{where}: a backslash ends the value")
            nxt = text[i + 1]
            if nxt not in _ESCAPES:
                raise UnitParseError(f"{where}: unsupported escape \\{nxt}")
            cur.append(_ESCAPES[nxt])
            in_word = True
            i += 2
            continue
        if quote:
            if ch == quote:
                quote = None
            else:
                cur.append(ch)
        elif ch in "\"'" and not cur:
            quote = ch
            in_word = True
        elif ch in " \t":
            if in_word:
                words.append("".join(cur))
                cur, in_word = [], False
        else:
            cur.append(ch)
            in_word = True
        i += 1
    if quote:
        raise UnitParseError(f"{where}: unterminated {quote} quote")
    if in_word:
        words.append("".join(cur))
    return words


def _undouble(word: str, char: str, where: str, refusal: str) -> str:
    """Undo the renderer's doubling of ``char`` (``%%``, ``$$``); a lone ``char`` is refused."""
    out: list[str] = []
    i = 0
    while i < len(word):
        if word[i] != char:
            out.append(word[i])
            i += 1
            continue
        if word[i + 1:i + 2] != char:
            raise UnitParseError(f"{where}: {refusal.format(next=word[i + 1:i + 2])} in {word!r}")
        out.append(char)
        i += 2
    return "".join(out)


def _unpercent(word: str, where: str) -> str:
    return _undouble(word, "%", where, "specifier %{next} (a meaning only systemd can give it)")


def _undollar(word: str, where: str) -> str:
    return _undouble(word, "$", where, "environment reference (the renderer writes $$)")


def _directives(text: str) -> list[tuple[int, str, str, str]]:
    """(line number, section, key, value) of each directive, continuation lines joined."""
    out: list[tuple[int, str, str, str]] = []
    section = ""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not pending:
            stripped = line.lstrip()
            if not stripped or stripped[0] in "#;":
                continue
            if stripped.startswith("[") and stripped.endswith("]"):
                section = stripped[1:-1]
                continue
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = " ".join(p.strip() for p in pending)
        pending = []
        key, sep, value = joined.partition("=")
        if not sep:
            raise UnitParseError(f"unit line {start}: {joined!r} is not key=value")
        out.append((start, section, key.strip(), value.strip()))
    if pending:
        raise UnitParseError(f"unit line {start}: the last line ends with a backslash")
    return out


@dataclass(frozen=True)
class PlainCommand:
    """What a unit runs: argv, its own environment (over the caller's) and working folder."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"

    @classmethod
    def from_unit(cls, text: str) -> PlainCommand:
        argv: tuple[str, ...] | None = None
        env: dict[str, str] = {}
        cwd = "/"
        for number, section, key, value in _directives(text):
            if section != "Service":
                continue
            where = f"unit line {number}: {key}="
            if key == "ExecStart":
                if argv is not None:
                    raise UnitParseError(f"{where}: more than one ExecStart (Type=oneshot?)")
                if value[:1] in "-@+!:|":
                    raise UnitParseError(f"{where}: prefix {value[:1]!r} is systemd's only")
                words = [_undollar(_unpercent(w, where), where) for w in _words(value, where)]
                if not words or not words[0].startswith("/"):
                    raise UnitParseError(f"{where}: the executable must be an absolute path")
                argv = tuple(words)
            elif key == "Environment":
                for word in _words(value, where):
                    name, sep, val = _unpercent(word, where).partition("=")
                    if not sep or not name:
                        raise UnitParseError(f"{where}: {word!r} is not NAME=value")
                    env[name] = val
            elif key == "WorkingDirectory":
                cwd = _unpercent(value.lstrip("-"), where)
                if not cwd.startswith("/"):
                    raise UnitParseError(f"{where}: {cwd!r} is not an absolute path")
        if argv is None:
            raise UnitParseError("the unit has no ExecStart= in its [Service] section")
        return cls(argv=argv, env=env, cwd=cwd)

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The process's environment: `base` (default: this process's) with the unit's on top."""
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged


# The launcher: start argv in a new session with the log as stdout/stderr, print its PID, exit
# without waiting (the server is then reparented to init, or to the nearest subreaper).
_LAUNCHER = r"""
import json, os, subprocess, sys
spec = json.loads(sys.stdin.read())
with open(os.devnull, "rb") as null, open(spec["log"], "ab", buffering=0) as log:
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


def start(cmd: PlainCommand, log_path: str, *, base_env: Mapping[str, str] | None = None,
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
