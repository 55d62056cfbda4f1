"""The lab's wheelhouse: real wheels downloaded once from the registry, plus stand-ins.

Lab hosts have no route to the internet (like many GPU hosts): everything they
install comes from this folder on the workstation, bind-mounted read-only while
their venvs are built.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ddtree_deploy.errors import LabError
from ddtree_deploy.lab import standin_dist, standin_wheels
from ddtree_deploy.lab.sysrun import sh
from ddtree_deploy.lab.topology import REAL_WHEELS

PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")


def _find(folder: Path, requirement: str) -> Path | None:
    name, _, version = requirement.partition("==")
    want_name, want_version = canonicalize_name(name), Version(version)
    for wheel in folder.glob("*.whl"):
        wname, wversion, _, _ = parse_wheel_filename(wheel.name)
        if wname == want_name and wversion == want_version:
            return wheel
    return None


def download_real(folder: Path) -> dict[str, Path]:
    """Each requirement of REAL_WHEELS -> its wheel file, downloading what is missing."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [r for r in REAL_WHEELS if _find(folder, r) is None]
    for req in missing:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                "--dest", str(folder)]
        for plat in PLATFORMS:
            argv += ["--platform", plat]
        argv += ["--platform", "any", req]
        sh(argv, timeout=600)
    found = {r: _find(folder, r) for r in REAL_WHEELS}
    absent = [r for r, p in found.items() if p is None]
    if absent:
        raise LabError(f"the registry gave no wheel for: {', '.join(absent)}")
    return {r: p for r, p in found.items() if p is not None}


def build_standins(folder: Path, real: dict[str, Path]) -> dict[str, Path]:
    """Build the lab's stand-in wheels (content-stable, so rebuilding changes nothing)."""
    folder.mkdir(parents=True, exist_ok=True)
    cu12 = real["nvidia-cuda-runtime-cu12==12.8.90"]
    cu13 = real["nvidia-cuda-runtime==13.0.96"]
    out: dict[str, Path] = {
        "standin:torch-cu128": standin_wheels.build_torch(folder, "cu128", cu12),
        "standin:torch-cu130": standin_wheels.build_torch(folder, "cu130", cu13),
        "standin:triton": standin_wheels.build_triton(folder),
        "standin:torchvision-cu128": standin_wheels.build_torchvision(folder, lane="cu128"),
        "standin:torchvision-cu130": standin_wheels.build_torchvision(folder, lane="cu130"),
        "standin:lab-server": standin_dist.build_standin_wheel(folder),
    }
    deps = folder / "deps"
    deps.mkdir(exist_ok=True)
    out["standin:sglang-kernel"] = standin_wheels.build_sglang_kernel(folder, deps)
    for lane in ("cu128", "cu130"):
        wheels = standin_wheels.build_nvidia_standins(folder / f"nvidia-{lane}", lane)
        for i, wheel in enumerate(wheels):
            out[f"standin:nvidia-{lane}#{i}"] = wheel
    return out


def expand(packages: tuple[str, ...], wheels: dict[str, Path]) -> list[Path]:
    """A venv recipe's entries -> wheel files ('standin:nvidia-cu128' is a group)."""
    files: list[Path] = []
    for entry in packages:
        group = sorted(k for k in wheels if k.startswith(entry + "#"))
        if group:
            files += [wheels[k] for k in group]
        elif entry in wheels:
            files.append(wheels[entry])
        else:
            raise LabError(f"the lab's wheelhouse has no wheel for '{entry}'")
    return files


def fingerprint(paths: list[Path]) -> str:
    """A hash of wheel contents, naming a provisioning layer built from them."""
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda x: x.name):
        h.update(p.name.encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:12]
