"""Rich tables for inventory and doctor (rendering only; the data comes in whole).

Every value from a host is text, never markup; at 80 columns no cell is cut (columns
fold) and the venv table puts each venv's key packages in one cell, one per line. A host
that failed gets a row that says so; its error is printed whole under the tables
(``failures``), where a key fingerprint is never cut.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ddtree_deploy.cli.render_table import add_row, make_table, notes
from ddtree_deploy.cli.text import cell, plain
from ddtree_deploy.facts.model import Facts, Gpu
from ddtree_deploy.rules.findings import Finding
from ddtree_deploy.rules.venv_lane import lane
from ddtree_deploy.transport.fanout import Outcome

KEY_PACKAGES = ("sglang", "sglang-kernel", "flashinfer-python", "xgrammar", "soundfile")
SHORT = {"sglang-kernel": "kernel", "flashinfer-python": "flashinfer"}
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
WIDE = 140  # from this width on, one column per key package


def _gpu_state(gpu: Gpu) -> Text:
    if gpu.dead:
        # "temperature: Unknown Error; pstate: Unknown Error" -> "Unknown Error"
        causes = sorted({p.split(":", 1)[-1].strip() for p in (gpu.error or "").split(";")} - {""})
        return Text.assemble(("DEAD", "bold red"), f" {plain(', '.join(causes))}".rstrip())
    if gpu.processes:
        return cell("busy", "yellow")
    return cell("free", "green")


def _holders(gpu: Gpu) -> str:
    parts = []
    for p in gpu.processes:
        text = f"pid {p.pid}"
        if p.ports:
            text += f" port {','.join(str(x) for x in p.ports)}"
        if p.unit:
            text += f" ({p.unit})"
        parts.append(text)
    return "\n".join(parts)


def gpu_table(outcomes: list[Outcome[Facts]]) -> Table:
    table = make_table("hosts x GPUs", ("host", "driver/CUDA", "GPU", "model", "SM",
                                        "MiB used/total", "state", "held by"))
    for o in outcomes:
        if o.value is None:
            add_row(table, o.host, cell("failed", "red"), "", "(below)", "", "", "", "")
            continue
        nv = o.value.nvidia
        driver = f"{nv.driver_version or '?'} / {nv.cuda_version or '?'}"
        if not nv.gpus:
            add_row(table, o.host, driver if nv.present else "-", "-",
                    nv.error or "no NVIDIA GPU", "", "", "", "")
        for i, g in enumerate(nv.gpus):
            add_row(table, o.host if i == 0 else "", driver if i == 0 else "", str(g.index),
                    (g.name or "?").removeprefix("NVIDIA "), g.compute_cap or "?",
                    f"{g.memory_used_mib if g.memory_used_mib is not None else '?'}/"
                    f"{g.memory_total_mib or '?'}",
                    _gpu_state(g), _holders(g))
    return table


def failures(outcomes: list[Outcome[Facts]]) -> list[RenderableType]:
    """Each failed host's error, whole, for under the tables."""
    return notes((o.host, str(o.error)) for o in outcomes if o.value is None)


def part_errors(outcomes: list[Outcome[Facts]]) -> list[RenderableType]:
    """What a host could not tell (systemctl failing, the tool's unit folder unreadable),
    under the tables: an empty service list there means "unknown", never "none"."""
    lines: list[tuple[str, str]] = []
    for o in outcomes:
        if o.value is None:
            continue
        for label, part in (("services", o.value.services), ("tool state", o.value.tool)):
            if part.error:
                lines.append((o.host, f"{label} could not be read: {part.error}"))
    return notes(lines)


def venv_table(outcomes: list[Outcome[Facts]], width: int = 80) -> Table:
    wide = width >= WIDE
    packages = [SHORT.get(n, n) for n in KEY_PACKAGES] if wide else ["key packages"]
    table = make_table("venvs x key packages",
                       ("host", "venv", "python", "torch", "lane", *packages))
    for o in outcomes:
        if o.value is None:
            continue
        for v in o.value.venvs:
            if not v.exists:
                add_row(table, o.host, v.path, cell("missing", "red"),
                        *[""] * (1 + len(packages)))
                continue
            report = lane(v)
            lane_text = cell(report.lane or "-")
            if report.mixed:
                majors = "+".join(f"cu{m}" for m in sorted(report.majors))
                lane_text = cell(f"MIXED {majors}", "bold red")
            torch = v.torch.version if v.torch and v.torch.version else "-"
            versions = [v.distributions.get(name, "-") for name in KEY_PACKAGES]
            pkgs = versions if wide else ["\n".join(
                f"{SHORT.get(n, n)} {ver}" for n, ver in zip(KEY_PACKAGES, versions, strict=True))]
            path = cell(v.path) if v.declared else Text.assemble(plain(v.path), (" (found)", "dim"))
            add_row(table, o.host, path, v.python_version or "?", torch, lane_text, *pkgs)
    return table


def findings_table(host: str, venv: str | None, findings: list[Finding]) -> Table:
    """The findings, one a row; their remedies go under the table (``remedies``)."""
    title = f"doctor {host}" + (f" --venv {venv}" if venv else "")
    table = make_table(title if findings else f"{title}: no findings",
                       ("severity", "id", "finding", "evidence"))
    for f in findings:
        evidence = "\n".join(f"{k}: {v}" for k, v in f.evidence.items())
        add_row(table, cell(f.severity, SEVERITY_STYLE.get(f.severity, "")), f.id, f.message,
                evidence)
    return table


def remedies(findings: list[Finding]) -> list[Text]:
    """Each finding's remedy as one line, printed with soft wrap: a command is never folded
    mid-token by a table cell (the terminal may wrap a long line; a copy gets it whole)."""
    return [Text.assemble(("fix ", "bold"), (plain(f.id), "bold"), ": ", plain(f.remedy))
            for f in findings if f.remedy]
