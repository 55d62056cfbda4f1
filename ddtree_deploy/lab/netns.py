"""Network namespaces and veth pairs for lab hosts (iproute2)."""

from __future__ import annotations

from pathlib import Path

from ddtree_deploy.lab.sysrun import sh
from ddtree_deploy.lab.topology import LabHost

NETNS_DIR = Path("/run/netns")
PREFIX = "ddtl-"


def create(host: LabHost) -> None:
    """A namespace for the host with one veth to the workstation, and no default route."""
    delete(host.netns, host.veth)
    sh(["ip", "netns", "add", host.netns])
    sh(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", "host0",
        "netns", host.netns])
    sh(["ip", "addr", "add", f"{host.gateway}/30", "dev", host.veth])
    sh(["ip", "link", "set", host.veth, "up"])
    sh(["ip", "-n", host.netns, "addr", "add", f"{host.address}/30", "dev", "host0"])
    sh(["ip", "-n", host.netns, "link", "set", "host0", "up"])
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
