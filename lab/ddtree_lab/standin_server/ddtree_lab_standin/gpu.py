"""The lab's GPUs: the per-host GPU spec and the claim files (stdlib only).

A lab container has no GPU. Its GPUs are described by a spec file
(``/etc/ddtree-lab/gpus.json``; env ``DDTREE_LAB_GPU_SPEC`` overrides)::

    {"driver_version", "cuda_version",
     "gpus": [{"index", "name", "uuid", "pci_bus_id", "memory_total_mib",
               "compute_cap", "power_limit_w", "dead"}]}

A process "using" a GPU writes a claim ``<pid>.json`` (further GPUs of the same
process: ``<pid>-gpu<index>.json``) into ``/run/ddtree-lab/gpu-claims`` (env
``DDTREE_LAB_GPU_CLAIMS`` overrides) with ``pid``, ``gpu_index`` (physical),
``used_mib``, ``process_name`` and ``starttime`` (field 22 of /proc/PID/stat, so
a reused PID does not count). The lab's nvidia-smi stand-in reads the same files.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SPEC = "/etc/ddtree-lab/gpus.json"
DEFAULT_CLAIMS = "/run/ddtree-lab/gpu-claims"


class GpuSpecError(Exception):
    """The GPU spec file is unreadable or malformed."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: int
    compute_cap: str
    power_limit_w: int
    dead: bool

    @property
    def capability(self) -> tuple[int, int]:
        major, _, minor = self.compute_cap.partition(".")
        return int(major), int(minor or 0)


@dataclass(frozen=True)
class GpuSetup:
    driver_version: str
    cuda_version: str
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class Claim:
    pid: int
    gpu_index: int
    used_mib: int
    process_name: str
    starttime: str


def spec_path() -> Path:
    return Path(os.environ.get("DDTREE_LAB_GPU_SPEC") or DEFAULT_SPEC)


def claims_dir() -> Path:
    return Path(os.environ.get("DDTREE_LAB_GPU_CLAIMS") or DEFAULT_CLAIMS)


def _gpu(raw: Any) -> Gpu:
    if not isinstance(raw, dict):
        raise GpuSpecError(f"a gpu entry is not an object: {raw!r}")
    try:
        return Gpu(
            index=int(raw["index"]),
            name=str(raw.get("name", "NVIDIA GPU")),
            uuid=str(raw.get("uuid", f"GPU-lab-{raw['index']}")),
            pci_bus_id=str(raw.get("pci_bus_id", "00000000:00:00.0")),
            memory_total_mib=int(raw.get("memory_total_mib", 0)),
            compute_cap=str(raw.get("compute_cap", "0.0")),
            power_limit_w=int(raw.get("power_limit_w", 0)),
            dead=bool(raw.get("dead", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise GpuSpecError(f"bad gpu entry {raw!r}: {exc}") from exc


def load_spec(path: Path | None = None) -> GpuSetup:
    """Read the spec; a missing file means a host without GPUs (no driver)."""
    path = path or spec_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return GpuSetup(driver_version="", cuda_version="", gpus=())
    except (OSError, ValueError) as exc:
        raise GpuSpecError(f"{path}: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus", []), list):
        raise GpuSpecError(f"{path}: expected an object with a 'gpus' list")
    gpus = tuple(sorted((_gpu(g) for g in raw.get("gpus", [])), key=lambda g: g.index))
    return GpuSetup(
        driver_version=str(raw.get("driver_version", "")),
        cuda_version=str(raw.get("cuda_version", "")),
        gpus=gpus,
    )


def visible_gpus(spec: GpuSetup, env: str | None) -> list[Gpu]:
    """The GPUs a CUDA process sees, in order, for a CUDA_VISIBLE_DEVICES value.

    As the CUDA runtime does: unset means all; entries are indices or UUID
    prefixes; the list stops at the first entry naming no GPU (or a repeat).
    """
    if env is None:
        return list(spec.gpus)
    seen: list[Gpu] = []
    for entry in (e.strip() for e in env.split(",")):
        match: Gpu | None = None
        if entry.isdigit():
            match = next((g for g in spec.gpus if g.index == int(entry)), None)
        elif entry.startswith("GPU-"):
            match = next((g for g in spec.gpus if g.uuid.startswith(entry)), None)
        if match is None or match in seen:
            break
        seen.append(match)
    return seen


def proc_starttime(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def live_claims(directory: Path | None = None) -> list[Claim]:
    """Claims whose process still runs (same PID and start time)."""
    directory = directory or claims_dir()
    claims: list[Claim] = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            claim = Claim(
                pid=int(raw["pid"]),
                gpu_index=int(raw["gpu_index"]),
                used_mib=int(raw["used_mib"]),
                process_name=str(raw.get("process_name", "python3")),
                starttime=str(raw.get("starttime", "")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        now = proc_starttime(claim.pid)
        if now is not None and (not claim.starttime or claim.starttime == now):
            claims.append(claim)
    return claims


def used_mib(gpu_index: int, directory: Path | None = None, exclude_pid: int = 0) -> int:
    return sum(
        c.used_mib
        for c in live_claims(directory)
        if c.gpu_index == gpu_index and c.pid != exclude_pid
    )


def write_claims(
    gpu_indices: list[int], used: int, process_name: str = "python3",
    directory: Path | None = None,
) -> list[Path]:
    """Claim GPUs for this process; returns the files written."""
    directory = directory or claims_dir()
    directory.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    starttime = proc_starttime(pid) or ""
    written: list[Path] = []
    for n, index in enumerate(gpu_indices):
        path = directory / (f"{pid}.json" if n == 0 else f"{pid}-gpu{index}.json")
        body = {
            "pid": pid,
            "gpu_index": index,
            "used_mib": int(used),
            "process_name": process_name,
            "starttime": starttime,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body) + "\n", encoding="utf-8")
        tmp.replace(path)
        written.append(path)
    return written


def remove_claims(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
