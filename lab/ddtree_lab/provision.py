"""Provisioning layers: what a kind of lab host has beyond Debian, built once and cached.

A layer is the upper directory of an overlay over the rootfs, filled by writing
the stand-in files (GPU layer, wrapper service, model folders, a CUDA toolkit
where the story's host had one) and by building the host's venvs with pip inside
the container, offline, from the wheelhouse bind-mounted read-only. Its name
carries a hash of everything that went in, so a change rebuilds it and nothing
else does.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path

from ddtree_lab import container, standin_dist, standin_wheels
from ddtree_lab.sysrun import sh
from ddtree_lab.topology import CUDA_VERSION, LabHost
from ddtree_lab.wheelhouse import expand

STANDIN_DIR = Path(__file__).resolve().parent / "standin"

# (path in the container, content, mode); a content of "->target" makes a symlink.
FileSpec = tuple[str, bytes, int]

NVCC_TEMPLATE = """#!/bin/sh
# Lab stand-in for the CUDA {release} toolkit's nvcc: this machine has no CUDA
# toolkit for this release; it answers --version as the real one does, which is
# all FlashInfer and the facts probe ask of it.
case "$1" in
  --version|-V)
    echo "nvcc: NVIDIA (R) Cuda compiler driver"
    echo "Copyright (c) 2005-2025 NVIDIA Corporation"
    echo "Built on {built}"
    echo "Cuda compilation tools, release {release}, V{full}"
    echo "Build cuda_{release}.r{release}/compiler.{build}_0"
    ;;
  *) echo "nvcc fatal   : lab stand-in nvcc only answers --version" >&2; exit 1 ;;
esac
"""

NVCC_RELEASES = {"12.8": ("Fri_Feb_21_20:23:50_PST_2025", "12.8.93", "35583870")}

SMI_LAUNCHER = b"""#!/usr/bin/python3 -S
# Lab stand-in for nvidia-smi (see /usr/lib/ddtree-lab/nvidia_smi.py): no GPU on this machine.
import sys

sys.path.insert(0, "/usr/lib/ddtree-lab")
from nvidia_smi import main

sys.exit(main())
"""

# The nvidia-smi stand-in: the command line and the parts it imports (from its own folder).
SMI_MODULES = ("nvidia_smi.py", "smi_claims.py", "smi_query.py", "smi_report.py", "smi_state.py")
SMI_LIB = "/usr/lib/ddtree-lab"

SSHD_CONF = b"PasswordAuthentication no\nKbdInteractiveAuthentication no\nUseDNS no\n"


def smi_files() -> list[FileSpec]:
    """The nvidia-smi stand-in's modules in SMI_LIB and the launcher that runs them."""
    # The stand-in is a module behind a small launcher, so its bytecode is cached after the
    # first call (a script run directly is compiled every time): the real nvidia-smi is a
    # native program. The probe asks NVML (the libnvidia-ml stand-in) first.
    files: list[FileSpec] = [(f"{SMI_LIB}/{name}", (STANDIN_DIR / name).read_bytes(), 0o644)
                             for name in SMI_MODULES]
    return [*files, ("/usr/bin/nvidia-smi", SMI_LAUNCHER, 0o755)]


def layer_files(host: LabHost, work: Path) -> list[FileSpec]:
    files: list[FileSpec] = [
        *smi_files(),
        ("/etc/ssh/sshd_config.d/ddtree-lab.conf", SSHD_CONF, 0o644),
    ]
    major, minor = (int(x) for x in CUDA_VERSION.split("."))  # what the GPU spec says
    libcuda = standin_wheels.build_libcuda(work / "libcuda.so.1",
                                           driver_api=major * 1000 + minor * 10)
    files.append(("/usr/lib/x86_64-linux-gnu/libcuda.so.1", libcuda.read_bytes(), 0o755))
    libnvml = standin_wheels.build_libnvml(work / "libnvidia-ml.so.1")
    files.append(("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", libnvml.read_bytes(), 0o755))
    files += standin_dist.host_files(host.kind)
    if host.nvcc_release:
        built, full, build = NVCC_RELEASES[host.nvcc_release]
        script = NVCC_TEMPLATE.format(release=host.nvcc_release, built=built, full=full,
                                      build=build)
        files.append((f"/usr/local/cuda-{host.nvcc_release}/bin/nvcc", script.encode(), 0o755))
        files.append(("/usr/local/cuda", f"->cuda-{host.nvcc_release}".encode(), 0o777))
    for unit in host.units:
        files.append((f"/etc/systemd/system/multi-user.target.wants/{unit}",
                      f"->/etc/systemd/system/{unit}".encode(), 0o777))
    return files


def write_files(root: Path, files: list[FileSpec]) -> None:
    for path, content, mode in files:
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        if content.startswith(b"->"):
            os.symlink(content[2:].decode(), dest)
        else:
            dest.write_bytes(content)
            os.chmod(dest, mode)


def venv_script(host: LabHost, wheels: dict[str, Path], wheel_root: Path) -> str:
    lines = ["set -e"]
    for venv in host.venvs:
        rel = [f"/mnt/wheels/{p.relative_to(wheel_root)}" for p in expand(venv.packages, wheels)]
        lines.append(f"python3 -m venv {shlex.quote(venv.path)}")
        lines.append(
            f"{shlex.quote(venv.path)}/bin/pip install --quiet --no-index --no-deps "
            f"--disable-pip-version-check --no-compile {' '.join(shlex.quote(r) for r in rel)}"
        )
    return "\n".join(lines) + "\n"


def layer_key(host: LabHost, files: list[FileSpec], script: str, wheels: list[Path]) -> str:
    h = hashlib.sha256(host.kind.encode())
    for path, content, mode in sorted(files):
        h.update(f"{path}:{mode}:".encode())
        h.update(hashlib.sha256(content).digest())
    h.update(script.encode())
    for wheel in sorted(wheels):
        h.update(hashlib.sha256(wheel.read_bytes()).digest())
    return h.hexdigest()[:12]


def ensure_layer(
    cache: Path, rootfs: Path, host: LabHost, wheels: dict[str, Path], wheel_root: Path
) -> Path:
    """Return the upper dir of the host kind's layer, building it if missing."""
    scratch = cache / "scratch" / host.kind
    container.reset_dir(scratch)
    files = layer_files(host, scratch)
    script = venv_script(host, wheels, wheel_root)
    used = [p for v in host.venvs for p in expand(v.packages, wheels)]
    layer = cache / f"layer-{host.kind}-{layer_key(host, files, script, used)}"
    if (layer / ".complete").exists():
        return layer / "upper"
    partial = layer.with_name(layer.name + ".partial")
    container.unmount_all(partial)
    container.remove_tree(partial)
    merged = partial / "merged"
    container.mount_overlay([rootfs], partial / "upper", partial / "work", merged)
    try:
        write_files(merged, files)
        sh(
            [
                "systemd-nspawn", "--quiet", "--register=no", "--keep-unit",
                "--private-network", f"--directory={merged}",
                f"--bind-ro={wheel_root}:/mnt/wheels", "--pipe",
                "--", "/bin/sh", "-c", script,
            ],
            timeout=900,
        )
    finally:
        container.unmount_all(partial)
    container.remove_tree(partial / "work")  # never through a mount left in place
    container.remove_tree(merged)
    (partial / ".complete").write_text("ok\n")
    container.remove_tree(layer)
    partial.rename(layer)
    return layer / "upper"


def run_files(host: LabHost, gpu_spec: bytes, host_key: Path, client_pub: Path) -> list[FileSpec]:
    """Files of one host's own writable layer, written at every `lab up`."""
    return [
        ("/etc/hostname", f"{host.name}\n".encode(), 0o644),
        ("/etc/ddtree-lab/gpus.json", gpu_spec, 0o644),
        ("/etc/ssh/ssh_host_ed25519_key", host_key.read_bytes(), 0o600),
        ("/etc/ssh/ssh_host_ed25519_key.pub", host_key.with_suffix(".pub").read_bytes(), 0o644),
        ("/root/.ssh/authorized_keys", client_pub.read_bytes(), 0o600),
    ]
