"""apply's run log: one JSON-lines file per host and run under the state folder.

$XDG_STATE_HOME/ddtree-deploy/runs/<UTC time>-<host>-<pid>.jsonl, mode 0600 in a 0700
folder, created new (never through a link planted at its name). Its lines, each with an
ISO-8601 UTC time `at`:

- ``{"event": "start", "who", "host", "what", "hosts_file", "tool"}`` (what: the command and
  its hosts, saved plan and --yes)
- ``{"event": "command", "command", "exit", "seconds"}``: every command the run sent the host
  (its display form: secret values are `***`, as in the tool's own messages); what it ran
  elsewhere is marked: `(workstation) pip download ...`, `(ct129) ...` (the lane copy's source)
- ``{"event": "step", "kind", "title", "deployment", "seconds", "ok"}``
- ``{"event": "end", "ok", "error", "seconds"}``

The output of commands is not kept (it may hold what the tool cannot know to be secret);
the values in `redact` (the deployments' API keys and HF tokens) are `***` in every line.
A log that cannot be written never fails the apply: the run goes on, said once on stderr.
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddtree_deploy import xdg
from ddtree_deploy.transport.command import mask_secrets

Say = Callable[[str], None]


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def runs_dir() -> Path:
    return xdg.state_dir() / "runs"


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def _masked(value: Any, secrets: frozenset[str]) -> Any:
    if not secrets:
        return value
    if isinstance(value, str):
        return mask_secrets(value, secrets)
    if isinstance(value, dict):
        return {k: _masked(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v, secrets) for v in value]
    return value


class RunLog:
    """A run's log; `event` appends one line (thread-safe enough: one writer per host)."""

    def __init__(self, host: str, *, say: Say = lambda _m: None) -> None:
        self.host = host
        self._say = say
        self.redact: frozenset[str] = frozenset()  # set by apply_host: masked in every line
        self._fd: int | None = None
        self._t0 = time.monotonic()
        folder = runs_dir()
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in host)[:64]
        self.path = folder / f"{stamp}-{safe}-{os.getpid()}.jsonl"
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                               | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._say(f"run log {self.path}: not kept ({exc.strerror or exc})")

    def event(self, event: str, **fields: Any) -> None:
        if self._fd is None:
            return
        doc = _masked({"at": now_iso(), "event": event, **fields}, self.redact)
        line = json.dumps(doc, default=str) + "\n"
        try:
            os.write(self._fd, line.encode("utf-8", "backslashreplace"))
        except OSError as exc:
            self._lost(exc)

    def start(self, what: dict[str, Any], hosts_file: str, tool: str) -> None:
        self.event("start", who=_who(), host=self.host, what=what, hosts_file=hosts_file,
                   tool=tool)

    def command(self, command: str, exit_code: int | None, seconds: float, stdout: str = "",
                stderr: str = "") -> None:
        """One command: its output is not kept (it may hold what the tool cannot know to be
        secret)."""
        self.event("command", command=command, exit=exit_code, seconds=round(seconds, 3))

    def step(self, kind: str, title: str, deployment: str | None, seconds: float,
             ok: bool) -> None:
        self.event("step", kind=kind, title=title, deployment=deployment,
                   seconds=round(seconds, 3), ok=ok)

    def end(self, error: str | None) -> None:
        self.event("end", ok=error is None, error=error,
                   seconds=round(time.monotonic() - self._t0, 3))
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
