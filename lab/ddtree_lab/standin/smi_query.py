"""The nvidia-smi stand-in's `--query-gpu=` and `--query-compute-apps=` with `--format=csv`.

Headers use the canonical field names with units (e.g. `memory.used [MiB]`, `used_gpu_memory
[MiB]`), and aliases map to them (gpu_name -> name). An unknown field prints `Field "x" is not a
valid field to query.`, exit 2. A dead GPU's sensor fields are "[Unknown Error]". Stdlib only.
"""

import time
from typing import Any

if __package__:  # imported as ddtree_lab.standin.*: the tool's tests, mypy
    from .smi_state import ERR_CSV, SmiExit
else:  # run as a script, or behind the lab's launcher: this folder is on sys.path
    from smi_state import ERR_CSV, SmiExit  # type: ignore[no-redef]


def _num(value: object, unit: str | None = None, dead: bool = False) -> tuple[str, str | None]:
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
    "persistence_mode": (
        "persistence_mode",
        lambda s, g: ("Enabled" if g["persistence"] else "Disabled", None),
    ),
    "compute_mode": ("compute_mode", lambda s, g: (g["compute_mode"], None)),
    "pstate": ("pstate", lambda s, g: _num(g["pstate"], None, g["dead"])),
    "mig.mode.current": ("mig.mode.current", lambda s, g: (g["mig"] or "[N/A]", None)),
    "fan.speed": (
        "fan.speed [%]",
        lambda s, g: (
            _num(g["fan"], "%", g["dead"]) if g["fan"] is not None or g["dead"] else ("[N/A]", None)
        ),
    ),
    "temperature.gpu": ("temperature.gpu", lambda s, g: _num(g["temp"], None, g["dead"])),
    "utilization.gpu": ("utilization.gpu [%]", lambda s, g: _num(g["util"], "%", g["dead"])),
    "memory.total": ("memory.total [MiB]", lambda s, g: (str(g["total"]), "MiB")),
    "memory.reserved": ("memory.reserved [MiB]", lambda s, g: (str(g["reserved"]), "MiB")),
    "memory.used": ("memory.used [MiB]", lambda s, g: (str(g["used"]), "MiB")),
    "memory.free": ("memory.free [MiB]", lambda s, g: (str(g["free"]), "MiB")),
    "power.draw": ("power.draw [W]", lambda s, g: _num(f"{g['draw']:.2f}", "W", g["dead"])),
    "power.limit": ("power.limit [W]", lambda s, g: (f"{g['limit']:.2f}", "W")),
}
GPU_ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "persistence-mode": "persistence_mode",
    "temperature": "temperature.gpu",
    "enforced.power.limit": "power.limit",
    "compute-mode": "compute_mode",
}
APP_FIELDS: dict[str, tuple[str, Any]] = {
    "pid": ("pid", lambda s, g, p: (str(p["pid"]), None)),
    "process_name": ("process_name", lambda s, g, p: (p["process_name"], None)),
    "used_memory": ("used_gpu_memory [MiB]", lambda s, g, p: (str(p["used_mib"]), "MiB")),
    "gpu_uuid": ("gpu_uuid", lambda s, g, p: (g["uuid"], None)),
    "gpu_bus_id": ("gpu_bus_id", lambda s, g, p: (g["bus_id"], None)),
    "gpu_name": ("gpu_name", lambda s, g, p: (g["name"], None)),
}
APP_ALIASES = {"name": "process_name", "used_gpu_memory": "used_memory"}


def query_csv(
    fields_arg: str,
    fmt: set[str],
    rows: list[tuple[Any, ...]],
    table: dict[str, tuple[str, Any]],
    aliases: dict[str, str],
) -> str:
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
