"""Install, start, stop and list the tool's units on a host, never touching others'.

A unit is ours when its [Unit] section carries `X-DDTreeDeploy-Managed=yes`.
Install is atomic: the text is verified with systemd-analyze in a scratch folder,
written beside the target under a temporary name, then renamed over it.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

from ddtree_deploy.errors import RefusedError, RemoteCommandError
from ddtree_deploy.service.spec import MANAGED_KEY, UNIT_DIR
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport, Result

UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@-]+\.service\Z")


def _unit(name: str) -> str:
    unit = name if name.endswith(".service") else f"{name}.service"
    if not UNIT_NAME.match(unit):
        raise RefusedError(f"not a valid unit name: {name!r}")
    return unit


def is_managed(text: str) -> bool:
    return any(line.strip() == f"{MANAGED_KEY}=yes" for line in text.splitlines())


def current_text(t: ExecTransport, unit: str) -> str | None:
    """The unit file's text in the unit folder, or None when there is none."""
    r = t.run(Command.shell('[ -f "$1" ] && cat "$1" || exit 3', f"{UNIT_DIR}/{unit}"),
              timeout=30)
    if r.exit_code == 3:
        return None
    r.check()
    return r.stdout


def _ensure_ours(t: ExecTransport, unit: str) -> str | None:
    text = current_text(t, unit)
    if text is not None and not is_managed(text):
        raise RefusedError(f"{unit} on {t.host} was not created by ddtree-deploy; it is left alone")
    if text is None and _systemctl(t, "cat", unit, check=False).ok:
        raise RefusedError(f"{unit} on {t.host} exists outside {UNIT_DIR} and was not created by "
                           "ddtree-deploy; it is left alone")
    return text


def _systemctl(t: ExecTransport, *args: str, check: bool = True) -> Result:
    r = t.run(Command.of("systemctl", *args, sudo=True), timeout=90)
    if check and not r.ok:
        raise RemoteCommandError(f"{t.host}: systemctl {' '.join(args)} failed: "
                                 f"{(r.stderr or r.stdout).strip()[-500:]}",
                                 output=r.error_output())
    return r


def install(t: ExecTransport, unit: str, text: str) -> bool:
    """Verify and install the unit text; True when the file changed."""
    from ddtree_deploy.service.verify import verify_unit

    unit = _unit(unit)
    if _ensure_ours(t, unit) == text:
        return False
    verify_unit(t, text, unit)
    t.put_stream(io.BytesIO(text.encode()), f"{UNIT_DIR}/{unit}", mode=0o644, sudo=True)
    _systemctl(t, "daemon-reload")
    return True


def restart(t: ExecTransport, unit: str) -> None:
    unit = _unit(unit)
    _systemctl(t, "reset-failed", unit, check=False)  # a unit at its start limit stays down
    _systemctl(t, "enable", unit)
    _systemctl(t, "restart", unit)


def down(t: ExecTransport, unit: str, *, remove: bool = False) -> bool:
    """Stop and disable one of our units (and remove it); False when there is none."""
    unit = _unit(unit)
    text = _ensure_ours(t, unit)
    if text is None:
        return False
    _systemctl(t, "disable", "--now", unit)
    if remove:  # the unit and its secret files (service/endpoint.py)
        from ddtree_deploy.service.endpoint import folder

        t.run(Command.of("rm", "-rf", "--", f"{UNIT_DIR}/{unit}",
                         folder(unit.removesuffix(".service")), sudo=True), timeout=30).check()
        _systemctl(t, "daemon-reload")
        _systemctl(t, "reset-failed", unit, check=False)
    return True


@dataclass(frozen=True)
class UnitState:
    unit: str
    active: str
    sub: str
    restarts: int
    main_pid: int
    exit_status: int
    deployment: str | None


LIST_SCRIPT = r"""
if ! out=$(systemctl show -p Version 2>&1); then  # no systemd, no bus: say so, never "none"
  printf '%s\n' "$out" >&2; exit 3
fi
for f in "$1"/*.service; do
  [ -f "$f" ] || continue
  grep -qx "$2=yes" "$f" || continue
  u=$(basename "$f")
  dep=$(sed -n "s/^X-DDTreeDeploy-Deployment=//p" "$f" | head -n 1)
  echo "@unit $u $dep"
  systemctl show "$u" -p ActiveState -p SubState -p NRestarts -p MainPID -p ExecMainStatus
done
"""


def parse_list(text: str) -> list[UnitState]:
    """Pure: LIST_SCRIPT's output -> states."""
    states: list[UnitState] = []
    cur: dict[str, str] = {}

    def flush() -> None:
        if cur:
            states.append(UnitState(
                unit=cur["unit"], active=cur.get("ActiveState", "?"), sub=cur.get("SubState", "?"),
                restarts=int(cur.get("NRestarts", "0") or 0),
                main_pid=int(cur.get("MainPID", "0") or 0),
                exit_status=int(cur.get("ExecMainStatus", "0") or 0),
                deployment=cur.get("deployment") or None,
            ))

    for line in text.splitlines():
        if line.startswith("@unit "):
            flush()
            parts = line.split(" ", 2)
            cur = {"unit": parts[1], "deployment": parts[2] if len(parts) > 2 else ""}
        elif "=" in line:
            key, _, value = line.partition("=")
            cur[key] = value
    flush()
    return states


def list_units(t: ExecTransport) -> list[UnitState]:
    """The tool's units and their states; RemoteCommandError when systemctl does not answer
    (a host without systemd has no services to list, which is not "no services")."""
    r = t.run(Command.shell(LIST_SCRIPT, UNIT_DIR, MANAGED_KEY), timeout=60)
    if r.exit_code == 3:
        raise RemoteCommandError(f"{t.host}: systemctl does not answer, so the services cannot "
                                 f"be listed: {(r.stderr or r.stdout).strip()[-500:]}",
                                 output=r.error_output())
    r.check()
    return parse_list(r.stdout)


def logs(t: ExecTransport, unit: str, lines: int = 200) -> str:
    unit = _unit(unit)
    r = t.run(Command.of("journalctl", "-u", unit, "-n", str(lines), "-o", "cat", "--no-pager",
                         "-q", sudo=True), timeout=60)
    r.check()
    return r.stdout
