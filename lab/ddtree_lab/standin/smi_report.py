"""The nvidia-smi stand-in's reports of whole GPUs: the summary table (no options), `-q`, `-q -x`.

The table has the R580 column widths: names longer than 27 characters are cut to 24 + "...",
process names longer than 32 keep their last 29 characters after "..."; a dead GPU shows "ERR!"
in its fan, temp, perf, power and util cells. `-q` is a short text form and `-q -x` a subset of
the real XML elements, in the real order ("Unknown Error" for a dead GPU's sensors). Stdlib only.
"""

import time
from typing import Any

if __package__:  # imported as ddtree_lab.standin.*: the tool's tests, mypy
    from .smi_state import ERR_TABLE, ERR_XML
else:  # run as a script, or behind the lab's launcher: this folder is on sys.path
    from smi_state import ERR_TABLE, ERR_XML  # type: ignore[no-redef]

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
