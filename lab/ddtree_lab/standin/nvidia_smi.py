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

import contextlib
import json
import os
import sys
import time
from typing import Any

SPEC_ENV, CLAIMS_ENV = "DDTREE_LAB_GPU_SPEC", "DDTREE_LAB_GPU_CLAIMS"
DEFAULT_SPEC, DEFAULT_CLAIMS = "/etc/ddtree-lab/gpus.json", "/run/ddtree-lab/gpu-claims"
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
    rest = stat[stat.rfind(")") + 2 :].split()  # fields 3.. follow the parenthesised comm
    return rest[19] if len(rest) > 19 else None


def write_claim(
    gpu_index: int,
    used_mib: int,
    process_name: str,
    claims_dir: str | None = None,
    pid: int | None = None,
) -> str:
    """Record that `pid` (default: this process) holds `used_mib` MiB on GPU `gpu_index`."""
    pid = os.getpid() if pid is None else pid
    folder = _claims_dir(claims_dir)
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        with contextlib.suppress(OSError):  # any lab user's server may claim, like /tmp
            os.chmod(folder, 0o1777)
    claim = {
        "pid": pid,
        "gpu_index": int(gpu_index),
        "used_mib": int(used_mib),
        "process_name": process_name,
        "starttime": proc_starttime(pid),
    }
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
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        live.append(
            {
                "pid": pid,
                "gpu_index": gpu,
                "used_mib": used,
                "process_name": str(claim.get("process_name") or "python3"),
            }
        )
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


# ---- query fields ---------------------------------------------------------------------------


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


# ---- the summary table ----------------------------------------------------------------------

BAR = "+" + "-" * 89 + "+"
SEP = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
GPU_HEAD = [
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
    "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
    "|                                         |                        |               MIG M. |",
    "|=========================================+========================+======================|",
]
PROC_HEAD = [
    "| Processes:" + " " * 78 + "|",
    "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
    "|        ID   ID                                                               Usage      |",
    "|" + "=" * 89 + "|",
]


def _cut(text: str, width: int, front: bool = False) -> str:
    if len(text) <= width:
        return text
    return "..." + text[-(width - 3) :] if front else text[: width - 3] + "..."


def table(state: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    drv, cuda = state["driver"], state["cuda"]
    lines = [
        time.asctime() + " " * 7,
        BAR,
        f"| NVIDIA-SMI {drv:<23}Driver Version: {drv:<15}CUDA Version: {cuda:<9}|",
        SEP,
    ]
    lines += GPU_HEAD
    for g in gpus:
        dead = g["dead"]
        pers = "On" if g["persistence"] else "Off"
        lines.append(
            f"|{g['index']:>4}  {_cut(g['name'], 27):<27}    {pers:<3} "
            f"|   {g['bus_id']} {'Off':>3} |{g['ecc']:>21} |"
        )
        fan = ERR_TABLE if dead else ("N/A" if g["fan"] is None else f"{g['fan']}%")
        temp = ERR_TABLE if dead else f"{g['temp']}C"
        perf = ERR_TABLE if dead else g["pstate"]
        draw = ERR_TABLE if dead else f"{int(g['draw'])}W"
        left = f" {fan:>3}  {temp:>4}    {perf}"
        right = f"{draw} / {round(g['limit']):>4}W "
        util = ERR_TABLE if dead else f"{g['util']}%"
        lines.append(
            f"|{left}{right:>{41 - len(left)}}|{str(g['used']) + 'MiB':>11} / "
            f"{str(g['total']) + 'MiB':>9} |{util:>8}{g['compute_mode']:>13} |"
        )
        lines.append("|" + " " * 41 + "|" + " " * 24 + f"|{g['mig'] or 'N/A':>21} |")
        lines.append(SEP)
    lines += ["", BAR] + PROC_HEAD
    procs = [(g, p) for g in gpus for p in g["procs"]]
    for g, p in procs:
        name = _cut(p["process_name"], 32, front=True)
        lines.append(
            f"|{g['index']:>5}   N/A  N/A{p['pid']:>16}{'C':>7}   {name:<32}"
            f"{str(p['used_mib']) + 'MiB':>14} |"
        )
    if not procs:
        lines.append(f"|  {'No running processes found':<87}|")
    lines.append(BAR)
    return "".join(line + "\n" for line in lines)


# ---- -q / -q -x -----------------------------------------------------------------------------

Node = tuple[str, str, Any]  # (xml tag, text label, str value or list of Node)


def _gpu_tree(g: dict[str, Any]) -> list[Node]:
    dead = g["dead"]
    domain, bus, dev = g["bus_id"][4:8], g["bus_id"][9:11], g["bus_id"][12:14]
    procs: list[Node] = [
        (
            "process_info",
            "",
            [
                ("gpu_instance_id", "GPU instance ID", "N/A"),
                ("compute_instance_id", "Compute instance ID", "N/A"),
                ("pid", "Process ID", str(p["pid"])),
                ("type", "Type", "C"),
                ("process_name", "Name", p["process_name"]),
                ("used_memory", "Used GPU Memory", f"{p['used_mib']} MiB"),
            ],
        )
        for p in g["procs"]
    ]
    fan = ERR_XML if dead else ("N/A" if g["fan"] is None else f"{g['fan']} %")
    return [
        ("product_name", "Product Name", g["name"]),
        ("product_brand", "Product Brand", "NVIDIA"),
        ("product_architecture", "Product Architecture", g["arch"]),
        ("persistence_mode", "Persistence Mode", "Enabled" if g["persistence"] else "Disabled"),
        (
            "mig_mode",
            "MIG Mode",
            [
                ("current_mig", "Current", g["mig"] or "N/A"),
                ("pending_mig", "Pending", g["mig"] or "N/A"),
            ],
        ),
        ("uuid", "GPU UUID", g["uuid"]),
        ("minor_number", "Minor Number", str(g["index"])),
        (
            "pci",
            "PCI",
            [
                ("pci_bus", "Bus", bus),
                ("pci_device", "Device", dev),
                ("pci_domain", "Domain", domain),
                ("pci_bus_id", "Bus Id", g["bus_id"]),
            ],
        ),
        ("fan_speed", "Fan Speed", fan),
        ("performance_state", "Performance State", ERR_XML if dead else g["pstate"]),
        (
            "fb_memory_usage",
            "FB Memory Usage",
            [(key, key.title(), f"{g[key]} MiB") for key in ("total", "reserved", "used", "free")],
        ),
        ("compute_mode", "Compute Mode", g["compute_mode"]),
        (
            "utilization",
            "Utilization",
            [
                ("gpu_util", "GPU", ERR_XML if dead else f"{g['util']} %"),
                ("memory_util", "Memory", ERR_XML if dead else "0 %"),
            ],
        ),
        (
            "temperature",
            "Temperature",
            [("gpu_temp", "GPU Current Temp", ERR_XML if dead else f"{g['temp']} C")],
        ),
        (
            "gpu_power_readings",
            "GPU Power Readings",
            [
                ("power_state", "Power State", ERR_XML if dead else g["pstate"]),
                (
                    "instant_power_draw",
                    "Instant Power Draw",
                    ERR_XML if dead else f"{g['draw']:.2f} W",
                ),
                ("current_power_limit", "Current Power Limit", f"{g['limit']:.2f} W"),
            ],
        ),
        ("processes", "Processes", procs),
        ("accounted_processes", "", []),
    ]


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _xml_nodes(nodes: list[Node], depth: int) -> list[str]:
    tabs, out = "\t" * depth, []
    for tag, _, value in nodes:
        if isinstance(value, list):
            out += [f"{tabs}<{tag}>"] + _xml_nodes(value, depth + 1) + [f"{tabs}</{tag}>"]
        else:
            out.append(f"{tabs}<{tag}>{_esc(value)}</{tag}>")
    return out


def query_xml(state: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    lines = [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">',
        "<nvidia_smi_log>",
        f"\t<timestamp>{time.asctime()}</timestamp>",
        f"\t<driver_version>{_esc(state['driver'])}</driver_version>",
        f"\t<cuda_version>{_esc(state['cuda'])}</cuda_version>",
        f"\t<attached_gpus>{len(state['gpus'])}</attached_gpus>",
    ]
    for g in gpus:
        lines += [f'\t<gpu id="{g["bus_id"]}">'] + _xml_nodes(_gpu_tree(g), 2) + ["\t</gpu>", ""]
    lines.append("</nvidia_smi_log>")
    return "".join(line + "\n" for line in lines)


def _text_nodes(nodes: list[Node], depth: int) -> list[str]:
    pad, out = "    " * depth, []
    for _, label, value in nodes:
        if not label:
            out += _text_nodes(value, depth) if isinstance(value, list) else []
        elif isinstance(value, list):
            out += (
                [f"{pad}{label:<{42 - len(pad)}}: None"]
                if not value
                else ([f"{pad}{label}"] + _text_nodes(value, depth + 1))
            )
        else:
            out.append(f"{pad}{label:<{42 - len(pad)}}: {value}")
    return out


def query_text(state: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"{'Timestamp':<42}: {time.asctime()}",
        f"{'Driver Version':<42}: {state['driver']}",
        f"{'CUDA Version':<42}: {state['cuda']}",
        "",
        f"{'Attached GPUs':<42}: {len(state['gpus'])}",
    ]
    for g in gpus:
        lines += [f"GPU {g['bus_id']}"] + _text_nodes(_gpu_tree(g), 1) + [""]
    return "".join(line + "\n" for line in lines)


# ---- reset, version, command line -----------------------------------------------------------


def reset(gpus: list[dict[str, Any]]) -> tuple[int, str]:
    failed = [
        (g, "Not Supported" if g["dead"] else "In use by another client")
        for g in gpus
        if g["dead"] or g["procs"]
    ]
    if not failed:
        return 0, "".join(f"GPU {g['bus_id']} was successfully reset.\n" for g in gpus)
    text = "The following GPUs could not be reset:\n" + "".join(
        f"  GPU {g['bus_id']}: {why}\n" for g, why in failed
    )
    return (3 if all(g["dead"] for g, _ in failed) else 255), text


def version(state: dict[str, Any]) -> str:
    drv = state["driver"]
    return (
        f"NVIDIA-SMI version  : {drv}\nNVML version        : {'.'.join(drv.split('.')[:2])}\n"
        f"DRIVER version      : {drv}\nCUDA Version        : {state['cuda']}\n"
    )


USAGE = """NVIDIA System Management Interface -- lab stand-in (no GPU here).

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
          --version             Print version information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -i,   --id=                 Target a specific GPU (index, UUID or PCI bus id; comma list).
    -q,   --query               Display GPU info.  -x, --xml-format  Produce XML output.
    --query-gpu=                Information about GPU (e.g. index,name,memory.used).
    --query-compute-apps=       Information about active compute processes.
    --format=                   csv, with optional noheader and nounits.
    -r,   --gpu-reset           Trigger a reset of one or more GPUs.
"""
VALUED = {
    "-i": "id",
    "--id": "id",
    "--query-gpu": "query_gpu",
    "--format": "format",
    "--query-compute-apps": "query_apps",
}
FLAGS = {
    "-h": "help",
    "--help": "help",
    "--version": "version",
    "-L": "list",
    "--list-gpus": "list",
    "-q": "query",
    "--query": "query",
    "-x": "xml",
    "--xml-format": "xml",
    "-r": "reset",
    "--gpu-reset": "reset",
}


def parse(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    args = iter(argv)
    for arg in args:
        key, eq, value = arg.partition("=")
        if key in VALUED:
            if not eq:
                value = next(args, None)  # type: ignore[assignment]
                if value is None:
                    raise SmiExit(
                        2,
                        f"ERROR: Option {arg} requires a value. "
                        "Please run 'nvidia-smi -h' for help.\n",
                    )
            opts[VALUED[key]] = value
        elif arg in FLAGS:
            opts[FLAGS[arg]] = True
        else:
            raise SmiExit(
                2, f"ERROR: Option {arg} is not recognized. Please run 'nvidia-smi -h' for help.\n"
            )
    return opts


def run(argv: list[str]) -> tuple[int, str]:
    """Everything main() does, minus the printing: (exit code, stdout text)."""
    opts = parse(argv)
    if opts.get("help"):
        return 0, USAGE
    state = load_state()
    if opts.get("version"):
        return 0, version(state)
    if not state["gpus"]:
        raise SmiExit(6, "No devices were found\n")
    gpus = select(state, opts.get("id"))
    if "query_gpu" in opts or "query_apps" in opts:
        fmt = {t.strip() for t in str(opts.get("format") or "").split(",") if t.strip()}
        if "csv" not in fmt:
            raise SmiExit(
                2,
                'Please specify the output format with "--format=csv". '
                "Please run 'nvidia-smi -h' for help.\n",
            )
        for token in fmt - {"csv", "noheader", "nounits"}:
            raise SmiExit(
                2,
                f"ERROR: Option {token} is not recognized. Please run 'nvidia-smi -h' for help.\n",
            )
        if "query_gpu" in opts:
            rows: list[tuple[Any, ...]] = [(state, g) for g in gpus]
            return 0, query_csv(opts["query_gpu"], fmt, rows, GPU_FIELDS, GPU_ALIASES)
        rows = [(state, g, p) for g in gpus for p in g["procs"]]
        return 0, query_csv(opts["query_apps"], fmt, rows, APP_FIELDS, APP_ALIASES)
    if opts.get("list"):
        return 0, "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)
    if opts.get("reset"):
        return reset(gpus)
    if opts.get("query"):
        return 0, (query_xml if opts.get("xml") else query_text)(state, gpus)
    return 0, table(state, gpus)


def main(argv: list[str] | None = None) -> int:
    try:
        code, text = run(sys.argv[1:] if argv is None else argv)
    except SmiExit as exc:
        code, text = exc.code, exc.text
    stream = sys.stderr if text.startswith("nvidia-smi stand-in:") else sys.stdout
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
