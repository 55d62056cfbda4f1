#!/usr/bin/python3
"""Lab stand-in for `nvidia-smi`. The lab installs it as /usr/bin/nvidia-smi in each container.

It exists because the test machine has no GPU. It prints what a real R580 nvidia-smi prints for
the queries ddtree-deploy uses. It is stdlib only, and importing it does nothing (main() runs only
when it is executed as a script).

Inputs:
  GPU spec JSON: $DDTREE_LAB_GPU_SPEC, default /etc/ddtree-lab/gpus.json
    {"driver_version", "cuda_version", "gpus": [{"index", "name", "uuid", "pci_bus_id",
     "memory_total_mib", "compute_cap", "power_limit_w", "dead"}]}
    Optional per-GPU keys and their defaults: persistence_mode true, ecc "N/A" (the table's
    Volatile Uncorr. ECC cell), fan_percent null (N/A), temperature_c 35, pstate "P0",
    power_draw_w 15% of the limit, utilization_gpu 0, compute_mode "Default", mig_mode null
    (N/A), memory_reserved_mib (total*615/143771, scaled from the H200 capture),
    memory_baseline_mib 9, architecture (derived from compute_cap).
  Claims: $DDTREE_LAB_GPU_CLAIMS, default /run/ddtree-lab/gpu-claims, one `<pid>.json` file each
    {"pid", "gpu_index", "used_mib", "process_name", "starttime"}. A claim counts while
    /proc/<pid> exists and, if starttime is given, field 22 of /proc/<pid>/stat still equals it
    (this catches PID reuse). Stale claim files are deleted when they are read. Claims on a dead
    GPU are ignored. write_claim() and remove_claim() manage these files for other stand-ins.

What is modelled (checked against the real H200 captures in tests/facts/nvidia_smi/):
  - `nvidia-smi` with no options: the summary table. Date line, version banner, three rows per
    GPU, and the Processes box, with the R580 column widths. Names longer than 27 characters are
    cut to 24 + "...". Process names longer than 32 keep their last 29 characters after "...".
  - `-L`, `-i/--id N|N,M|UUID|bus id` (an unknown id prints "No devices were found", exit 6).
  - `--query-gpu=F,..` and `--query-compute-apps=F,..` with `--format=csv[,noheader][,nounits]`.
    Headers use the canonical field names with units (e.g. `memory.used [MiB]`,
    `used_gpu_memory [MiB]`), and aliases map to them (gpu_name -> name). An unknown field prints
    `Field "x" is not a valid field to query.`, exit 2.
  - `-q` (a short text form) and `-q -x` (XML: a subset of the real elements, in the real order).
  - `--version`, `-h`. An unknown option prints "ERROR: Option X is not recognized. Please run
    'nvidia-smi -h' for help.", exit 2.
  - Memory: used = sum of live claims + baseline while any claim is live, else 0.
    free = total - reserved - used. (Real free can differ by 1 MiB from rounding.)
  - A dead GPU ("dead": true, like ct129's GPU1) is still listed, uses 0 MiB, and shows "ERR!" in
    the table's fan, temp, perf, power and util cells. In CSV those fields are "[Unknown Error]",
    and in the XML they are "Unknown Error". `-r/--gpu-reset` on it prints "could not be reset ...
    Not Supported", exit 3. On a GPU with live claims it prints "In use by another client", exit
    255. Otherwise it prints "... was successfully reset.".
  - A missing spec prints the real "couldn't communicate with the NVIDIA driver" text, exit 9.

Not modelled: loops (-l), -f, MIG instances, clocks, ECC counters, -d filters, and changing any
setting other than the simulated reset.
"""

import json
import os
import sys
import time
from typing import Any

SPEC_ENV, CLAIMS_ENV = "DDTREE_LAB_GPU_SPEC", "DDTREE_LAB_GPU_CLAIMS"
DEFAULT_SPEC, DEFAULT_CLAIMS = "/etc/ddtree-lab/gpus.json", "/run/ddtree-lab/gpu-claims"
ERR_CSV, ERR_XML, ERR_TABLE = "[Unknown Error]", "Unknown Error", "ERR!"
ARCH = {"7.0": "Volta", "7.5": "Turing", "8.0": "Ampere", "8.6": "Ampere", "8.9": "Ada Lovelace",
        "9.0": "Hopper", "10.0": "Blackwell", "12.0": "Blackwell"}
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n")


class SmiExit(Exception):
    """Stop with this text (stdout) and exit code."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


# ---- claims ---------------------------------------------------------------------------------

def _claims_dir(claims_dir: str | None = None) -> str:
    return claims_dir or os.environ.get(CLAIMS_ENV) or DEFAULT_CLAIMS


def proc_starttime(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None if the PID is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2:].split()  # fields 3.. follow the parenthesised comm
    return rest[19] if len(rest) > 19 else None


def write_claim(gpu_index: int, used_mib: int, process_name: str,
                claims_dir: str | None = None, pid: int | None = None) -> str:
    """Record that `pid` (default: this process) holds `used_mib` MiB on GPU `gpu_index`."""
    pid = os.getpid() if pid is None else pid
    folder = _claims_dir(claims_dir)
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        os.chmod(folder, 0o1777)  # any lab user's server may claim, like /tmp
    claim = {"pid": pid, "gpu_index": int(gpu_index), "used_mib": int(used_mib),
             "process_name": process_name, "starttime": proc_starttime(pid)}
    path = os.path.join(folder, f"{pid}.json")
    tmp = os.path.join(folder, f".{pid}.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(claim, fh)
    os.replace(tmp, path)
    return path


def remove_claim(pid: int, claims_dir: str | None = None) -> bool:
    """Delete the claim of `pid`; True if there was one."""
    try:
        os.unlink(os.path.join(_claims_dir(claims_dir), f"{int(pid)}.json"))
    except FileNotFoundError:
        return False
    return True


def live_claims(claims_dir: str | None = None) -> list[dict[str, Any]]:
    """The claims whose process still runs, sorted by (gpu_index, pid). Stale files are deleted."""
    folder, live = _claims_dir(claims_dir), []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as fh:
                claim = json.load(fh)
            pid, gpu, used = int(claim["pid"]), int(claim["gpu_index"]), int(claim["used_mib"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable or half-written: not a claim
        now = proc_starttime(pid)
        want = claim.get("starttime")
        if now is None or (want is not None and str(want) != now):
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        live.append({"pid": pid, "gpu_index": gpu, "used_mib": used,
                     "process_name": str(claim.get("process_name") or "python3")})
    return sorted(live, key=lambda c: (c["gpu_index"], c["pid"]))


# ---- spec -------------------------------------------------------------------------------------

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
        state = {"driver": str(spec["driver_version"]), "cuda": str(spec["cuda_version"]),
                 "gpus": sorted(gpus, key=lambda g: g["index"])}
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
        "index": int(g["index"]), "name": str(g["name"]), "uuid": str(g["uuid"]),
        "bus_id": str(g["pci_bus_id"]).upper(), "total": total, "cc": cc, "limit": limit,
        "dead": bool(g.get("dead", False)), "persistence": bool(g.get("persistence_mode", True)),
        "ecc": str(g.get("ecc", "N/A")), "fan": None if fan is None else int(fan),
        "temp": int(g.get("temperature_c", 35)), "pstate": str(g.get("pstate", "P0")),
        "draw": float(g.get("power_draw_w", round(limit * 0.15, 2))),
        "util": int(g.get("utilization_gpu", 0)),
        "compute_mode": str(g.get("compute_mode", "Default")),
        "mig": None if mig is None else str(mig),
        "reserved": int(g.get("memory_reserved_mib", total * 615 // 143771)),
        "baseline": int(g.get("memory_baseline_mib", 9)),
        "arch": str(g.get("architecture", ARCH.get(cc, "Unknown"))), "procs": [],
    }


def select(state: dict[str, Any], ids: str | None) -> list[dict[str, Any]]:
    """GPUs named by -i (indexes, UUIDs or bus ids, comma separated); all when ids is None."""
    if ids is None:
        return list(state["gpus"])
    chosen = []
    for token in (t.strip() for t in ids.split(",")):
        hit = [g for g in state["gpus"] if token in (str(g["index"]), g["uuid"])
               or (len(token) > 7 and g["bus_id"].endswith(token.upper()))]
        if not hit:
            raise SmiExit(6, "No devices were found\n")
        chosen.extend(h for h in hit if h not in chosen)
    return chosen


# ---- query fields ---------------------------------------------------------------------------

def _num(value: float | int, unit: str | None = None, dead: bool = False) -> tuple[str, str | None]:
    return (ERR_CSV, None) if dead else (str(value), unit)


GPU_FIELDS: dict[str, tuple[str, Any]] = {  # canonical name -> (header, getter(state, gpu))
    "timestamp": ("timestamp", lambda s, g: (time.strftime("%Y/%m/%d %H:%M:%S.000"), None)),
    "driver_version": ("driver_version", lambda s, g: (s["driver"], None)),
    "count": ("count", lambda s, g: (str(len(s["gpus"])), None)),
    "index": ("index", lambda s, g: (str(g["index"]), None)),
    "name": ("name", lambda s, g: (g["name"], None)),
    "uuid": ("uuid", lambda s, g: (g["uuid"], None)),
    "pci.bus_id": ("pci.bus_id", lambda s, g: (g["bus_id"], None)),
    "compute_cap": ("compute_cap", lambda s, g: (g["cc"], None)),
    "persistence_mode": ("persistence_mode", lambda s, g: (
        "Enabled" if g["persistence"] else "Disabled", None)),
    "compute_mode": ("compute_mode", lambda s, g: (g["compute_mode"], None)),
    "pstate": ("pstate", lambda s, g: _num(g["pstate"], None, g["dead"])),
    "mig.mode.current": ("mig.mode.current", lambda s, g: (g["mig"] or "[N/A]", None)),
    "fan.speed": ("fan.speed [%]", lambda s, g: _num(g["fan"], "%", g["dead"])
                  if g["fan"] is not None or g["dead"] else ("[N/A]", None)),
    "temperature.gpu": ("temperature.gpu", lambda s, g: _num(g["temp"], None, g["dead"])),
    "utilization.gpu": ("utilization.gpu [%]", lambda s, g: _num(g["util"], "%", g["dead"])),
    "memory.total": ("memory.total [MiB]", lambda s, g: (str(g["total"]), "MiB")),
    "memory.reserved": ("memory.reserved [MiB]", lambda s, g: (str(g["reserved"]), "MiB")),
    "memory.used": ("memory.used [MiB]", lambda s, g: (str(g["used"]), "MiB")),
    "memory.free": ("memory.free [MiB]", lambda s, g: (str(g["free"]), "MiB")),
    "power.draw": ("power.draw [W]", lambda s, g: _num(f"{g['draw']:.2f}", "W", g["dead"])),
    "power.limit": ("power.limit [W]", lambda s, g: (f"{g['limit']:.2f}", "W")),
}
GPU_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
               "persistence-mode": "persistence_mode", "temperature": "temperature.gpu",
               "enforced.power.limit": "power.limit", "compute-mode": "compute_mode"}
APP_FIELDS: dict[str, tuple[str, Any]] = {
    "pid": ("pid", lambda s, g, p: (str(p["pid"]), None)),
    "process_name": ("process_name", lambda s, g, p: (p["process_name"], None)),
    "used_memory": ("used_gpu_memory [MiB]", lambda s, g, p: (str(p["used_mib"]), "MiB")),
    "gpu_uuid": ("gpu_uuid", lambda s, g, p: (g["uuid"], None)),
    "gpu_bus_id": ("gpu_bus_id", lambda s, g, p: (g["bus_id"], None)),
    "gpu_name": ("gpu_name", lambda s, g, p: (g["name"], None)),
}
APP_ALIASES = {"name": "process_name", "used_gpu_memory": "used_memory"}


def query_csv(fields_arg: str, fmt: set[str], rows: list[tuple[Any, ...]],
              table: dict[str, tuple[str, Any]], aliases: dict[str, str]) -> str:
    """Render --query-* as the real tool does: 'a, b, c' lines, units unless nounits."""
    names = [f.strip() for f in fields_arg.split(",")]
    getters = []
    for name in names:
        canonical = aliases.get(name, name)
        if canonical not in table:
            raise SmiExit(2, f'Field "{name}" is not a valid field to query.\n\n')
        getters.append(table[canonical])
    out = [] if "noheader" in fmt else [", ".join(h for h, _ in getters)]
    for row in rows:
        cells = []
        for _, getter in getters:
            value, unit = getter(*row)
            cells.append(value if unit is None or "nounits" in fmt else f"{value} {unit}")
        out.append(", ".join(cells))
    return "".join(line + "\n" for line in out)
