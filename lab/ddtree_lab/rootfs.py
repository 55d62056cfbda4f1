"""The lab's Debian 12 root file system: made once with debootstrap, then shared read-only.

Every container mounts it as the lowest overlayfs layer, so it is never written
after it is built. It is cached under the XDG cache folder and rebuilt only when
the package list below changes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ddtree_lab.fsguard import remove_tree
from ddtree_lab.sysrun import sh

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "iproute2",
    "procps",
    "sudo",
    "ca-certificates",
)


def rootfs_key() -> str:
    return hashlib.sha256(f"{SUITE} {' '.join(PACKAGES)}".encode()).hexdigest()[:12]


def ensure_rootfs(cache: Path, log: list[str] | None = None) -> Path:
    """Return the cached rootfs, building it with debootstrap if missing."""
    target = cache / f"rootfs-{SUITE}-{rootfs_key()}"
    if (target / ".complete").exists():
        return target
    tmp = target.with_name(target.name + ".partial")
    remove_tree(tmp)  # refuses through a mount
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if log is not None:
        log.append(f"debootstrap {SUITE} into {target}")
    sh(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(tmp),
            MIRROR,
        ],
        timeout=900,
    )
    # Host keys made by openssh-server's postinst would be shared by every host:
    # drop them; each lab host gets its own (see keys.py).
    for key in (tmp / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (tmp / "etc/machine-id").write_text("")
    (tmp / ".complete").write_text(rootfs_key() + "\n")
    remove_tree(target)
    tmp.rename(target)
    return target
