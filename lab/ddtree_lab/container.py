"""One lab host: an overlayfs root booted by systemd-nspawn inside its namespace.

Layers, lowest first: the shared Debian rootfs (read-only), the host kind's
provisioning layer (venvs, stand-ins; read-only, cached), and the host's own
writable layer, made empty at every `lab up`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from ddtree_deploy.localproc import pid_alive
from ddtree_lab.errors import LabError
from ddtree_lab.fsguard import mounts_under, remove_tree
from ddtree_lab.sysrun import sh
from ddtree_lab.topology import LabHost


def mount_overlay(lowers: list[Path], upper: Path, work: Path, merged: Path) -> None:
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    lowerdir = ":".join(str(p) for p in lowers)
    sh(["mount", "-t", "overlay", "overlay", "-o",
        f"lowerdir={lowerdir},upperdir={upper},workdir={work}", str(merged)])


def unmount_all(root: Path) -> None:
    for point in mounts_under(root):
        sh(["umount", str(point)], check=False)
        if point in mounts_under(root):
            sh(["umount", "-l", str(point)], check=False)


def boot(host: LabHost, merged: Path, log_path: Path) -> int:
    """Start systemd-nspawn --boot in the background; return its PID."""
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
    try:
        proc = subprocess.Popen(
            [
                "systemd-nspawn",
                "--boot",
                "--register=no",
                "--keep-unit",
                f"--network-namespace-path=/run/netns/{host.netns}",
                f"--directory={merged}",
                f"--machine={host.name}",
                "--console=passive",
                "--link-journal=no",
                "--resolv-conf=off",
                "--timezone=off",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    return proc.pid


def wait_for_ssh(address: str, deadline_s: float, pid: int) -> None:
    """Wait until sshd on address:22 sends its banner, or the container dies."""
    end = time.monotonic() + deadline_s
    last = "no answer"
    while time.monotonic() < end:
        if not pid_alive(pid):
            raise LabError(f"the container at {address} exited during boot")
        try:
            with socket.create_connection((address, 22), timeout=1.0) as s:
                s.settimeout(2.0)
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise LabError(f"sshd at {address}:22 did not answer within {deadline_s:.0f}s ({last})")


def pid_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def stop(pid: int, grace_s: float = 20.0) -> None:
    """Power the container off (SIGTERM to nspawn), then SIGKILL after grace_s."""
    if not pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        if not pid_alive(pid):
            _reap(pid)
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    while pid_alive(pid) and time.monotonic() < end + 5:
        time.sleep(0.1)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def nspawn_pids_for(root: Path) -> list[int]:
    """PIDs of systemd-nspawn processes whose --directory lies under root."""
    prefix = f"--directory={root.resolve()}"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = pid_cmdline(int(entry.name))
        if argv and argv[0].endswith("systemd-nspawn") and any(
            a.startswith(prefix) for a in argv
        ):
            pids.append(int(entry.name))
    return pids


def reset_dir(path: Path) -> None:
    """An empty folder at path; refuses (MountedError) if something is mounted in it."""
    remove_tree(path)
    path.mkdir(parents=True)


LAB_MARKER = "etc/ddtree-lab/gpus.json"  # present in every lab container's root


def orphan_inits() -> list[int]:
    """Init processes of lab containers whose systemd-nspawn is gone (it was SIGKILLed).

    Killing nspawn does not end the container: its systemd is reparented and runs
    on in its own PID namespace. Found by being a namespace's PID 1 (NSpid ends in
    1) under a parent that is not systemd-nspawn, with the lab's marker in its root.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        nspid = fields.get("NSpid", "").split()
        ppid = int(fields.get("PPid", "0").strip() or 0)
        if len(nspid) < 2 or nspid[-1] != "1":
            continue
        parent = pid_cmdline(ppid)
        if parent and parent[0].endswith("systemd-nspawn"):
            continue
        if (entry / "root" / LAB_MARKER).exists():
            found.append(int(entry.name))
    return found


def kill_orphans(grace_s: float = 10.0) -> list[int]:
    pids = orphan_inits()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # ends the whole PID namespace
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    return pids
