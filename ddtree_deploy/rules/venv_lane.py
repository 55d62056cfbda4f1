"""A venv's CUDA lane, read from torch and the shared objects inside it.

``lane(venv)`` is pure and reused by plan/overlay code: torch/version.py's ``cuda``
("12.8" -> cu128, "13.0" -> cu130), the CUDA majors each compiled extension needs
(libcudart/libnvrtc/libcublas sonames) and the nvidia/ layout (per-component CUDA 12
folders vs the single CUDA 13 folder).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddtree_deploy.facts.model import Venv

_LOCAL_TAG = re.compile(r"\+cu(\d{2,3})$")


@dataclass(frozen=True)
class LaneReport:
    lane: str | None  # "cu128" / "cu130"; None: no CUDA torch found
    majors: frozenset[int] = frozenset()  # every CUDA major torch and the extensions need
    mixed: bool = False
    torch_major: int | None = None
    evidence: dict[str, list[str]] = field(default_factory=dict)  # file -> the CUDA libs it needs


def lane_from_cuda(cuda: str | None) -> str | None:
    """ "12.8" -> "cu128", "13.0" -> "cu130"; None for a CPU build or unreadable text."""
    if not cuda:
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", cuda.strip())
    return f"cu{match.group(1)}{match.group(2)}" if match else None


def lane_major(lane: str | None) -> int | None:
    """ "cu128" -> 12, "cu130" -> 13."""
    if not lane or not re.fullmatch(r"cu\d{3}", lane):
        return None
    return int(lane[2:4])


def _torch_lane(venv: Venv) -> str | None:
    if venv.torch is None:
        return None
    found = lane_from_cuda(venv.torch.cuda)
    if found is None and venv.torch.version:
        match = _LOCAL_TAG.search(venv.torch.version)
        found = f"cu{match.group(1)}" if match and len(match.group(1)) == 3 else None
    return found


def lane(venv: Venv) -> LaneReport:
    torch_lane = _torch_lane(venv)
    torch_major = lane_major(torch_lane)
    evidence: dict[str, list[str]] = {}
    if torch_lane is not None and venv.torch is not None:
        evidence["torch/version.py"] = [f"cuda={venv.torch.cuda or torch_lane}"]
    ext_majors: set[int] = set()
    for ext in sorted(venv.extensions, key=lambda e: e.path):
        if ext.cuda_majors:
            ext_majors.update(ext.cuda_majors)
            evidence[ext.path] = sorted(ext.needed)
    majors = set(ext_majors)
    if torch_major is not None:
        majors.add(torch_major)
    against_torch = torch_major is not None and any(m != torch_major for m in ext_majors)
    layout = venv.nvidia
    both_layouts = bool(layout.cu12_components) and layout.cu13
    both_needed = {12, 13} <= ext_majors
    mixed = against_torch or (both_layouts and both_needed) or (torch_major is None and both_needed)
    if mixed and both_layouts:
        evidence["nvidia/"] = [f"cu12: {', '.join(sorted(layout.cu12_components))}", "cu13"]
    return LaneReport(torch_lane, frozenset(majors), mixed, torch_major, evidence)
