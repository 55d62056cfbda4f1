"""The nvidia-smi stand-in's view of the GPUs: the spec file plus the live claims, and `-i`.

GPU spec JSON: $DDTREE_LAB_GPU_SPEC, default /etc/ddtree-lab/gpus.json (its keys and their
defaults: see nvidia_smi.py). Memory: used = sum of live claims + baseline while any claim is
live, else 0; free = total - reserved - used. Claims on a dead GPU are ignored. A missing spec
is the real "couldn't communicate with the NVIDIA driver" (exit 9). Also the stand-in's one
exception, SmiExit, and the error cells the output formats share. Stdlib only.
"""

import json
import os
from typing import Any

if __package__:  # imported as ddtree_lab.standin.*: the tool's tests, mypy
    from .smi_claims import live_claims
else:  # run as a script, or behind the lab's launcher: this folder is on sys.path
    from smi_claims import live_claims  # type: ignore[no-redef]

SPEC_ENV, DEFAULT_SPEC = "DDTREE_LAB_GPU_SPEC", "/etc/ddtree-lab/gpus.json"
ERR_CSV, ERR_XML, ERR_TABLE = "[Unknown Error]", "Unknown Error", "ERR!"
ARCH = {
    "7.0": "Volta",
    "7.5": "Turing",
    "8.0": "Ampere",
    "8.6": "Ampere",
    "8.9": "Ada Lovelace",
    "9.0": "Hopper",
    "10.0": "Blackwell",
    "12.0": "Blackwell",
}
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


class SmiExit(Exception):
    """Stop with this text (stdout) and exit code."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


def load_state(spec_path: str | None = None, claims_dir: str | None = None) -> dict[str, Any]:
    """Spec plus live claims: per GPU its processes and memory used/free."""
    path = spec_path or os.environ.get(SPEC_ENV) or DEFAULT_SPEC
    try:
        with open(path, encoding="utf-8") as fh:
            spec = json.load(fh)
    except FileNotFoundError as exc:
        raise SmiExit(9, NO_DRIVER) from exc
    except (OSError, ValueError) as exc:
        raise SmiExit(9, f"nvidia-smi stand-in: cannot read GPU spec {path}: {exc}\n") from exc
    try:
        gpus = [_gpu(g) for g in spec["gpus"]]
        state: dict[str, Any] = {
            "driver": str(spec["driver_version"]),
            "cuda": str(spec["cuda_version"]),
            "gpus": sorted(gpus, key=lambda g: g["index"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise SmiExit(9, f"nvidia-smi stand-in: bad GPU spec {path}: {exc!r}\n") from exc
    by_index = {g["index"]: g for g in state["gpus"]}
    for claim in live_claims(claims_dir):
        gpu = by_index.get(claim["gpu_index"])
        if gpu is not None and not gpu["dead"]:
            gpu["procs"].append(claim)
    for gpu in state["gpus"]:
        claimed = sum(c["used_mib"] for c in gpu["procs"])
        gpu["used"] = claimed + gpu["baseline"] if gpu["procs"] else 0
        gpu["free"] = max(gpu["total"] - gpu["reserved"] - gpu["used"], 0)
    return state


def _gpu(g: dict[str, Any]) -> dict[str, Any]:
    total, limit = int(g["memory_total_mib"]), float(g["power_limit_w"])
    cc = str(g["compute_cap"])
    fan = g.get("fan_percent")
    mig = g.get("mig_mode")
    return {
        "index": int(g["index"]),
        "name": str(g["name"]),
        "uuid": str(g["uuid"]),
        "bus_id": str(g["pci_bus_id"]).upper(),
        "total": total,
        "cc": cc,
        "limit": limit,
        "dead": bool(g.get("dead", False)),
        "persistence": bool(g.get("persistence_mode", True)),
        "ecc": str(g.get("ecc", "N/A")),
        "fan": None if fan is None else int(fan),
        "temp": int(g.get("temperature_c", 35)),
        "pstate": str(g.get("pstate", "P0")),
        "draw": float(g.get("power_draw_w", round(limit * 0.15, 2))),
        "util": int(g.get("utilization_gpu", 0)),
        "compute_mode": str(g.get("compute_mode", "Default")),
        "mig": None if mig is None else str(mig),
        "reserved": int(g.get("memory_reserved_mib", total * 615 // 143771)),
        "baseline": int(g.get("memory_baseline_mib", 9)),
        "arch": str(g.get("architecture", ARCH.get(cc, "Unknown"))),
        "procs": [],
    }


def select(state: dict[str, Any], ids: str | None) -> list[dict[str, Any]]:
    """GPUs named by -i (indexes, UUIDs or bus ids, comma separated); all when ids is None."""
    if ids is None:
        return list(state["gpus"])
    chosen: list[dict[str, Any]] = []
    for token in (t.strip() for t in ids.split(",")):
        hit = [
            g
            for g in state["gpus"]
            if token in (str(g["index"]), g["uuid"])
            or (len(token) > 7 and g["bus_id"].endswith(token.upper()))
        ]
        if not hit:
            raise SmiExit(6, "No devices were found\n")
        chosen.extend(h for h in hit if h not in chosen)
    return chosen
