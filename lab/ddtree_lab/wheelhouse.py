"""The lab's wheelhouse: real wheels downloaded once from the registry, plus stand-ins.

Lab hosts have no route to the internet (like many GPU hosts): everything they
install comes from this folder on the workstation, bind-mounted read-only while
their venvs are built.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ddtree_lab import standin_dist, standin_wheels
from ddtree_lab.errors import LabError
from ddtree_lab.topology import REAL_WHEELS

LAB_PYTHON, LAB_GLIBC = "3.11.2", "2.36"  # Debian 12, the lab hosts' system


def download_real(folder: Path) -> dict[str, Path]:
    """Each requirement of REAL_WHEELS -> its wheel file, downloaded once (the installer's
    wheelhouse, for the lab hosts' Python and glibc)."""
    from ddtree_deploy.converge.steps._install import Requirement, wheelhouse

    found = {}
    for req in REAL_WHEELS:
        wheels = wheelhouse([Requirement(req, deps=False)], python_version=LAB_PYTHON,
                            glibc=LAB_GLIBC, cache=folder)
        if len(wheels) != 1:
            raise LabError(f"the registry gave {len(wheels)} wheels for {req}")
        found[req] = wheels[0]
    return found


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
