"""Apply an overlay plan on its target, from the workstation: upload, start detached, poll.

The target runs one stdlib script (remote/bundle.py's OVERLAY_APPLY: remote/facts_elf.py and
remote/overlay_apply{_state,_checks,}.py) with the venv's own python. It is started
DETACHED from the SSH session (a transient systemd unit where systemd runs, else
setsid + nohup), so killing this CLI or cutting the connection never stops a swap
half-way; the workstation only polls `status` until the run's result file appears (each call waits
on the host, up to `poll` seconds, for that file: the answer comes within 20 ms of it).
Every state file lives in <venv>/.ddtree-deploy/overlay (see remote/overlay_apply.py).
"""

from __future__ import annotations

import io
import json
import posixpath
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddtree_deploy.errors import DeployError, RefusedError, RemoteCommandError, UsageError
from ddtree_deploy.overlay.lanefile import LaneChecks
from ddtree_deploy.overlay.model import OverlayPlan
from ddtree_deploy.remote.bundle import OVERLAY_APPLY
from ddtree_deploy.remote.runner import RemoteScriptError, run_json
from ddtree_deploy.transport.base import Transport
from ddtree_deploy.transport.command import Command

STATE = ".ddtree-deploy/overlay"
SCRIPT_NAME = "apply_remote.py"  # its name on the host
DEFAULT_RESERVE = 64 << 20  # bytes kept free beyond what the swap itself needs
EXIT_NO_SPACE, EXIT_BUSY = 5, 6

# Start the script so that it outlives this SSH session. $1 python, $2 script, $3 venv,
# $4 log, $5 unit name, then the script's arguments.
_LAUNCH = r"""
py=$1; script=$2; venv=$3; log=$4; unit=$5; shift 5
if [ "$(id -u)" = 0 ] && [ -d /run/systemd/system ] && command -v systemd-run >/dev/null 2>&1
then
  if systemd-run --quiet --collect --unit="$unit" -- /bin/sh -c \
      'log=$1; shift; exec "$@" >>"$log" 2>&1 </dev/null' sh "$log" "$py" "$script" \
      --venv "$venv" "$@"; then
    echo systemd-run; exit 0
  fi
fi
command -v setsid >/dev/null 2>&1 || { echo "setsid is missing on this host" >&2; exit 127; }
setsid nohup "$py" "$script" --venv "$venv" "$@" >>"$log" 2>&1 </dev/null &
echo setsid
"""

_PUT = 'umask 022; mkdir -p -- "$(dirname -- "$1")" && cat > "$1.part" && mv -f -- "$1.part" "$1"'


def script_source() -> str:
    """The target-side script as one stdlib-only file; runs main(sys.argv[1:])."""
    return OVERLAY_APPLY.source()


def build_request(plan: OverlayPlan, checks: LaneChecks | None = None, *,
                  reserve: int = DEFAULT_RESERVE, verify: bool = True, keep_backups: int = 2,
                  check_timeout: float = 300.0) -> dict[str, Any]:
    """What the target's `apply` reads: the plan, the lane's checks and the options."""
    spec: dict[str, Any] = checks.model_dump() if checks is not None else {}
    spec["timeout"] = check_timeout
    return {"plan": plan.model_dump(mode="json"), "checks": spec, "reserve": reserve,
            "verify": verify, "keep_backups": keep_backups}


@dataclass
class ApplyOutcome:
    """The end of one remote apply or rollback, as its result file tells it."""

    result: str  # applied | unchanged | rolled-back | failed | no-space | busy
    message: str
    backup: str | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)



def overlay_dir(venv: str) -> str:
    return posixpath.join(venv, STATE)


def staging_dir(venv: str, plan_id: str) -> str:
    """Where the transfer stages a plan's blobs (as staging/<plan id>/blobs/<sha256>)."""
    return posixpath.join(overlay_dir(venv), "staging", plan_id)


def _python(venv: str) -> str:
    return posixpath.join(venv, "bin", "python")


def _script_path(venv: str) -> str:
    return posixpath.join(overlay_dir(venv), SCRIPT_NAME)


def _put(t: Transport, data: bytes, path: str, sudo: bool) -> None:
    res = t.run_stream_in(Command.shell(_PUT, path, sudo=sudo), io.BytesIO(data), timeout=120)
    if not res.ok:
        raise RemoteCommandError(f"{t.host}: could not write {path}: {res.stderr.strip()}")


def _call(t: Transport, venv: str, *args: str, sudo: bool, timeout: float = 120) -> dict[str, Any]:
    """Run the uploaded script in the foreground (status, history); its JSON (whatever its
    exit code: the answer says how it went)."""
    cmd = Command((_python(venv), _script_path(venv), "--venv", venv, *args), sudo=sudo)
    return run_json(t, cmd, timeout=timeout, what="the overlay script", answers=None)


def upload_script(t: Transport, venv: str, *, sudo: bool = False) -> None:
    _put(t, script_source().encode(), _script_path(venv), sudo)


def launch(t: Transport, venv: str, command: str, request: dict[str, Any] | None = None, *,
           sudo: bool = False) -> str:
    """Upload the script (and request), start `command` detached; returns the run's token."""
    token = uuid.uuid4().hex
    upload_script(t, venv, sudo=sudo)
    args = ["--token", token, command]
    if request is not None:
        path = posixpath.join(overlay_dir(venv), "requests", token + ".json")
        _put(t, json.dumps(request).encode(), path, sudo)
        args.append(path)
    log = posixpath.join(overlay_dir(venv), "run.log")
    cmd = Command.shell(_LAUNCH, _python(venv), _script_path(venv), venv, log,
                        f"ddtree-overlay-{token[:12]}", *args, sudo=sudo)
    t.run(cmd, timeout=60).check()
    return token


def wait(t: Transport, venv: str, token: str, *, timeout: float = 3600.0, poll: float = 1.0,
         start_grace: float = 60.0, sudo: bool = False,
         on_status: Callable[[dict[str, Any]], None] | None = None) -> ApplyOutcome:
    """Poll the target until the run `token` has a result (reattaching works the same)."""
    start = time.monotonic()
    seen = False
    poll = max(poll, 0.05)
    waits = True
    while True:
        # the host waits up to `poll` for the result itself: no round trip's lag after it
        asked = time.monotonic()
        try:
            status = _call(t, venv, "status", "--token", token,
                           *(("--wait", f"{poll:g}") if waits else ()), sudo=sudo)
        except RemoteScriptError as exc:  # the venv's script is another version's, which
            if not waits or "--wait" not in (exc.result.stderr if exc.result else ""):
                raise                     # has no --wait: ask as it understands
            waits = False
            continue
        if on_status is not None:
            on_status(status)
        result = status.get("token_result")
        if isinstance(result, dict):
            return _outcome(result)
        running = status.get("holder") or {}
        journal = status.get("journal") or {}
        seen = seen or journal.get("token") == token or bool(
            status.get("running") and running.get("command") in ("apply", "rollback"))
        elapsed = time.monotonic() - start
        if not seen and elapsed > start_grace:
            raise DeployError(f"{t.host}: the overlay run {token[:12]} did not start",
                              hint=f"see {overlay_dir(venv)}/run.log on the host")
        if elapsed > timeout:
            raise DeployError(f"{t.host}: the overlay run {token[:12]} is still going after "
                              f"{timeout:g}s; it continues on the host",
                              hint="`ddtree-deploy overlay history HOST --venv VENV` "
                                   "shows how it ended")
        if time.monotonic() - asked < poll / 2:  # answered at once, no result: pace the calls
            time.sleep(poll)


def _outcome(data: dict[str, Any]) -> ApplyOutcome:
    return ApplyOutcome(result=str(data.get("result")), message=str(data.get("message", "")),
                        backup=data.get("backup"), checks=list(data.get("checks") or []),
                        raw=data)


def _raise_for(host: str, outcome: ApplyOutcome, *, ok: tuple[str, ...]) -> ApplyOutcome:
    if outcome.result in ok:
        return outcome
    message = f"{host}: {outcome.message or outcome.result}"
    if outcome.result == "no-space":
        raise RefusedError(message, hint="free space on the target or stage less")
    if outcome.result == "busy":
        raise RefusedError(message, hint="wait for the other run, then see `overlay history`")
    raise DeployError(message)


def apply_plan(t: Transport, plan: OverlayPlan, checks: LaneChecks | None = None, *,
               reserve: int = DEFAULT_RESERVE, verify: bool = True, timeout: float = 3600.0,
               poll: float = 1.0, sudo: bool = False,
               on_status: Callable[[dict[str, Any]], None] | None = None) -> ApplyOutcome:
    """Swap the plan's staged files in on its target; DeployError when it failed (the
    target was then rolled back, or left untouched: the message says which)."""
    venv = plan.target.venv
    if not posixpath.isabs(venv):
        raise UsageError(f"the plan's target venv is not an absolute path: {venv!r}")
    request = build_request(plan, checks, reserve=reserve, verify=verify)
    token = launch(t, venv, "apply", request, sudo=sudo)
    outcome = wait(t, venv, token, timeout=timeout, poll=poll, sudo=sudo, on_status=on_status)
    return _raise_for(t.host, outcome, ok=("applied", "unchanged"))


def rollback(t: Transport, venv: str, *, timeout: float = 3600.0,
             poll: float = 1.0, sudo: bool = False) -> ApplyOutcome:
    """Undo the latest applied overlay of `venv`, byte for byte, from its backup."""
    token = launch(t, venv, "rollback", sudo=sudo)
    outcome = wait(t, venv, token, timeout=timeout, poll=poll, sudo=sudo)
    return _raise_for(t.host, outcome, ok=("rolled-back",))


def status(t: Transport, venv: str, *, sudo: bool = False) -> dict[str, Any]:
    """The journal, whether a run holds the lock (and who), after recovery if none does."""
    upload_script(t, venv, sudo=sudo)
    return _call(t, venv, "status", sudo=sudo)


def history(t: Transport, venv: str, *, sudo: bool = False
            ) -> tuple[list[dict[str, Any]], str | None]:
    """One entry per apply/rollback on `venv`: time, op, lane, plan id, result, detail; and
    what the host said instead (a venv that is not there). A read: the script goes on stdin
    to the host's python3 (not the venv's, which may be missing), nothing is uploaded and
    nothing is written in the venv."""
    answer = run_json(t, script_source(), ("--venv", venv, "history"), timeout=120,
                      what="the overlay history", flags=("-I",), sudo=sudo, answers=None)
    if answer.get("result") != "ok":
        raise RemoteCommandError(f"{t.host}: overlay history of {venv}: "
                                 f"{answer.get('message') or answer.get('result')}")
    entries = answer.get("history", [])
    message = answer.get("message")
    return ([e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else [],
            message if isinstance(message, str) else None)
