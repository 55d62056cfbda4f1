"""The lab's own SSH client key, per-host host keys and known_hosts.

All of it lives in the tool's XDG state folder (lab/), at the fixed paths the
embedded hosts.yaml names; the user's ~/.ssh is never touched.
"""

from __future__ import annotations

from pathlib import Path

from ddtree_lab.sysrun import sh
from ddtree_lab.topology import LabHost


def client_key(lab_dir: Path) -> Path:
    key = lab_dir / "id_ed25519"
    if not key.exists():
        lab_dir.mkdir(parents=True, exist_ok=True)
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ddtree-deploy-lab",
            "-f", str(key)])
    return key


def host_key(lab_dir: Path, host: LabHost) -> Path:
    key = lab_dir / "hostkeys" / host.name / "ssh_host_ed25519_key"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}",
            "-f", str(key)])
    return key


def write_known_hosts(lab_dir: Path, hosts: list[LabHost]) -> Path:
    lines = []
    for host in hosts:
        pub = host_key(lab_dir, host).with_suffix(".pub").read_text().split()
        lines.append(f"{host.address} {pub[0]} {pub[1]}\n")
    path = lab_dir / "known_hosts"
    path.write_text("".join(lines))
    return path
