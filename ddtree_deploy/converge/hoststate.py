"""The host state plan/apply reads besides facts, in one round trip: the installed text of
each deployment's unit, the units this tool created (with their deployment), the
restarts an earlier run left pending, and each service's secrets digest (root-only:
service/endpoint.py). Read with sudo when the facts probe could not read it. A digest of
another form than scrypt's (the first tool's SHA-256) comes back as `other`, never itself: it
never matches (the secrets are installed again), and what the host sends is shown at -vv and
logged, where only scrypt's form is masked (transport/command.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddtree_deploy.service import endpoint
from ddtree_deploy.service.spec import DEPLOYMENT_KEY, MANAGED_KEY, UNIT_DIR
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport

STATE_DIR = "/var/lib/ddtree-deploy"
PENDING_DIR = f"{STATE_DIR}/pending-restart"

SCRIPT = r"""
unitdir="$1"; key="$2"; pending="$3"; services="$4"; digest="$5"; shift 5
for u in "$@"; do
  echo "@unit $u"
  if [ -f "$unitdir/$u" ]; then cat "$unitdir/$u"; echo; echo "@end"; else echo "@absent"; fi
done
echo "@managed"
for f in "$unitdir"/*.service; do
  [ -f "$f" ] || continue
  grep -qx "$key=yes" "$f" || continue
  dep=$(sed -n "s/^X-DDTreeDeploy-Deployment=//p" "$f" | head -n 1)
  echo "$(basename "$f") $dep"
done
echo "@pending"
[ -d "$pending" ] && ls -1 "$pending"
echo "@secrets"
for f in "$services"/*/"$digest"; do
  [ -f "$f" ] || continue
  d=$(head -c 256 "$f" | head -n 1)
  case "$d" in scrypt[$]*) ;; *) d=other ;; esac
  echo "$(basename "$(dirname "$f")") $d"
done
echo "@done"
"""


@dataclass
class HostState:
    units: dict[str, str | None] = field(default_factory=dict)  # unit -> installed text
    managed: dict[str, str] = field(default_factory=dict)  # unit -> deployment name ('' if none)
    pending: set[str] = field(default_factory=set)  # units with a restart pending
    secrets: dict[str, str] = field(default_factory=dict)  # service stem -> secrets digest


def parse(text: str) -> HostState:
    state = HostState()
    lines = text.split("\n")
    i = 0
    section = ""
    while i < len(lines):
        line = lines[i]
        if line.startswith("@unit "):
            unit = line[6:]
            i += 1
            if i < len(lines) and lines[i] == "@absent":
                state.units[unit] = None
            else:
                body = []
                while i < len(lines) and lines[i] != "@end":
                    body.append(lines[i])
                    i += 1
                state.units[unit] = "\n".join(body)  # `echo` after cat: exact text back
        elif line in ("@managed", "@pending", "@secrets", "@done"):
            section = line
        elif line and section == "@managed":
            unit, _, dep = line.partition(" ")
            state.managed[unit] = dep
        elif line and section == "@pending":
            state.pending.add(line)
        elif line and section == "@secrets":
            stem, _, digest = line.partition(" ")
            state.secrets[stem] = digest
        i += 1
    return state


def from_facts(tool_units: dict[str, str], pending: list[str], units: list[str],
               secrets: dict[str, str] | None = None) -> HostState:
    """The same state from the facts probe (no extra round trip: plan on cached facts)."""
    state = HostState(units={u: tool_units.get(u) for u in units}, pending=set(pending),
                      secrets=dict(secrets or {}))
    for unit, text in tool_units.items():
        dep = next((ln.split("=", 1)[1] for ln in text.splitlines()
                    if ln.startswith(f"{DEPLOYMENT_KEY}=")), "")
        state.managed[unit] = dep
    return state


def read(t: ExecTransport, units: list[str]) -> HostState:
    r = t.run(Command.shell(SCRIPT, UNIT_DIR, MANAGED_KEY, PENDING_DIR, endpoint.ROOT,
                            endpoint.DIGEST_NAME, *units, sudo=True),
              timeout=60)
    r.check()
    return parse(r.stdout)


def mark_pending(t: ExecTransport, unit: str) -> None:
    t.run(Command.shell('mkdir -p "$1" && touch "$1/$2"', PENDING_DIR, unit, sudo=True),
          timeout=30).check()


def clear_pending(t: ExecTransport, unit: str) -> None:
    t.run(Command.of("rm", "-f", f"{PENDING_DIR}/{unit}", sudo=True), timeout=30).check()
