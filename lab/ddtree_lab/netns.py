"""Network namespaces and veth pairs for lab hosts (iproute2), and shaping their links (tc)."""

from __future__ import annotations

import re
from pathlib import Path

from ddtree_deploy.errors import UsageError
from ddtree_lab.sysrun import sh
from ddtree_lab.topology import LabHost

NETNS_DIR = Path("/run/netns")
PREFIX = "ddtl-"
PEER = "host0"  # the host's end of its veth, inside its namespace
_RATE = re.compile(r"[1-9][0-9]*(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)\Z")


def create(host: LabHost) -> None:
    """A namespace for the host with one veth to the workstation, and no default route."""
    delete(host.netns, host.veth)
    sh(["ip", "netns", "add", host.netns])
    sh(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", PEER,
        "netns", host.netns])
    sh(["ip", "addr", "add", f"{host.gateway}/30", "dev", host.veth])
    sh(["ip", "link", "set", host.veth, "up"])
    sh(["ip", "-n", host.netns, "addr", "add", f"{host.address}/30", "dev", PEER])
    sh(["ip", "-n", host.netns, "link", "set", PEER, "up"])
    sh(["ip", "-n", host.netns, "link", "set", "lo", "up"])


def delete(netns: str, veth: str) -> None:
    if (NETNS_DIR / netns).exists():
        sh(["ip", "netns", "del", netns], check=False)
    # Deleting the namespace removes its end of the pair and so the pair; a
    # veth left from a crash without its namespace is removed here.
    sh(["ip", "link", "del", veth], check=False)


def stale() -> list[str]:
    """Lab namespaces left on this machine (for instance by a killed run)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(PREFIX))


def guard_subnet(prefix: str) -> None:
    """Blackhole the whole lab range in the workstation's namespace while the lab is up.

    Each host's /30 route via its veth is more specific and wins; any other lab
    address (a host that is still booting, or a typo) is dropped here instead of
    leaving the machine by the default route.
    """
    sh(["ip", "route", "replace", "blackhole", f"{prefix}.0.0/16"])


def unguard_subnet(prefix: str) -> None:
    sh(["ip", "route", "del", "blackhole", f"{prefix}.0.0/16"], check=False)


def check_rate(rate: str) -> str:
    """A tc rate (`1gbit`, `500mbit`, `100mbps`), lower-cased; UsageError otherwise."""
    value = rate.strip().lower()
    if not _RATE.match(value):
        raise UsageError(f"--link-rate {rate!r}: expected a number and a tc unit, such as "
                         "1gbit, 500mbit or 100mbps")
    return value


def _tbf(rate: str) -> list[str]:
    return ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]


def shape(netns: str, veth: str, rate: str) -> None:
    """Limit the link both ways: a tbf on the workstation's veth and on host0 in the namespace.

    `replace` so that shaping an already shaped link sets the new rate.
    """
    sh(["tc", "qdisc", "replace", "dev", veth, *_tbf(rate)])
    sh(["tc", "-n", netns, "qdisc", "replace", "dev", PEER, *_tbf(rate)])


def unshape(netns: str, veth: str) -> None:
    """Back to the kernel's default queue on both ends (nothing to do when unshaped)."""
    sh(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
    if (NETNS_DIR / netns).exists():
        sh(["tc", "-n", netns, "qdisc", "del", "dev", PEER, "root"], check=False)


def shaped_rate(netns: str | None, dev: str) -> str | None:
    """The tbf rate on dev (in netns, or the workstation's when None), or None."""
    cmd = ["tc", *(["-n", netns] if netns else []), "qdisc", "show", "dev", dev, "root"]
    out = sh(cmd, check=False).stdout.decode(errors="replace")
    found = re.search(r"\btbf\b.*?\brate (\S+)", out)
    return found.group(1) if found else None
