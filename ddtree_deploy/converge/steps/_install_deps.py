"""An extra package's dependency closure, without what the CUDA lane owns.

`uv pip install soundfile` would also pull whatever its dependencies name — for
flashinfer-python that is torch and CUDA wheels, which only the lane's overlay may
bring (a registry torch would replace the lane's). So dependencies are followed
here, one wheel at a time (each downloaded with --no-deps into the shared
wheelhouse), skipping the lane's distributions and whatever the venv already
satisfies; the result is installed with --no-deps.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508
from packaging.utils import canonicalize_name, parse_wheel_filename

from ddtree_deploy.converge.steps import _install as installer
from ddtree_deploy.transport import ExecTransport

MAX_WHEELS = 200


def requires(wheel: Path, python_version: str) -> list[str]:
    """Requires-Dist of a wheel whose markers hold for the target (no extras)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode(errors="replace").splitlines()
    env = {"python_version": ".".join(python_version.split(".")[:2]),
           "python_full_version": python_version, "extra": ""}
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Pep508(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate(env):
            req.marker = None
            out.append(str(req))
    return out


def closure(root: str, have: dict[str, str], owned: Callable[[str], bool], *,
            python_version: str, glibc: str | None,
            beside: ExecTransport | None = None) -> list[Path]:
    """Wheels to install for `root` and the dependencies it still lacks."""
    todo: list[str] = [root]
    seen: set[str] = set()
    files: list[Path] = []
    while todo and len(files) < MAX_WHEELS:
        text = todo.pop(0)
        name = canonicalize_name(Pep508(text).name)
        if name in seen or owned(name) or (text != root and installer.satisfied(text, have)):
            continue
        seen.add(name)
        wheels = installer.wheelhouse([installer.Requirement(text, deps=False)],
                                      python_version=python_version, glibc=glibc,
                                      beside=beside)
        files += wheels
        for wheel in wheels:
            todo += requires(wheel, python_version)
    return files


def pinned(wheels: list[Path]) -> list[installer.Requirement]:
    """`name==version` (no deps) for each wheel file."""
    out = []
    for wheel in wheels:
        name, version, _, _ = parse_wheel_filename(wheel.name)
        out.append(installer.Requirement(f"{name}=={version}", deps=False))
    return out
