"""Rich tables for inventory and doctor (rendering only; the data comes in whole)."""

from __future__ import annotations

from rich.table import Table

from ddtree_deploy.facts.model import Facts, Gpu
from ddtree_deploy.fanout import Outcome
from ddtree_deploy.rules.findings import Finding
from ddtree_deploy.rules.lane import lane

KEY_PACKAGES = ("sglang", "sglang-kernel", "flashinfer-python", "xgrammar", "soundfile")
SHORT = {"sglang-kernel": "kernel", "flashinfer-python": "flashinfer"}
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _gpu_state(gpu: Gpu) -> str:
    if gpu.dead:
        # "temperature: Unknown Error; pstate: Unknown Error" -> "Unknown Error"
        causes = sorted({p.split(":", 1)[-1].strip() for p in (gpu.error or "").split(";")} - {""})
        return f"[bold red]DEAD[/bold red] {', '.join(causes)}".strip()
    if gpu.processes:
        return "[yellow]busy[/yellow]"
    return "[green]free[/green]"


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
    table = Table(title="hosts x GPUs")
    for col in ("host", "driver/CUDA", "GPU", "model", "SM", "MiB used/total", "state",
                "held by"):
        table.add_column(col, no_wrap=col in ("host", "GPU", "SM", "MiB used/total"))
    for o in outcomes:
        if o.value is None:
            table.add_row(o.host, "[red]unreachable[/red]", "", str(o.error), "", "", "", "")
            continue
        nv = o.value.nvidia
        driver = f"{nv.driver_version or '?'} / {nv.cuda_version or '?'}"
        if not nv.gpus:
            table.add_row(o.host, driver if nv.present else "-", "-",
                          nv.error or "no NVIDIA GPU", "", "", "", "")
        for i, g in enumerate(nv.gpus):
            table.add_row(o.host if i == 0 else "", driver if i == 0 else "", str(g.index),
                          (g.name or "?").removeprefix("NVIDIA "), g.compute_cap or "?",
                          f"{g.memory_used_mib if g.memory_used_mib is not None else '?'}/"
                          f"{g.memory_total_mib or '?'}",
                          _gpu_state(g), _holders(g))
    return table


def venv_table(outcomes: list[Outcome[Facts]]) -> Table:
    table = Table(title="venvs x key packages")
    for col in ("host", "venv", "python", "torch", "lane", *KEY_PACKAGES):
        table.add_column(SHORT.get(col, col), no_wrap=col in ("host", "venv", "torch", "lane"))
    for o in outcomes:
        if o.value is None:
            continue
        for v in o.value.venvs:
            if not v.exists:
                table.add_row(o.host, v.path, "[red]missing[/red]", *[""] * (2 + len(KEY_PACKAGES)))
                continue
            report = lane(v)
            lane_text = report.lane or "-"
            if report.mixed:
                majors = "+".join(f"cu{m}" for m in sorted(report.majors))
                lane_text = f"[bold red]MIXED {majors}[/bold red]"
            torch = v.torch.version if v.torch and v.torch.version else "-"
            pkgs = [v.distributions.get(name, "-") for name in KEY_PACKAGES]
            path = v.path if v.declared else f"{v.path} [dim](found)[/dim]"
            table.add_row(o.host, path, v.python_version or "?", torch, lane_text, *pkgs)
    return table


def findings_table(host: str, venv: str | None, findings: list[Finding]) -> Table:
    title = f"doctor {host}" + (f" --venv {venv}" if venv else "")
    table = Table(title=title if findings else f"{title}: no findings")
    for col in ("severity", "id", "finding", "evidence", "remedy"):
        table.add_column(col)
    for f in findings:
        style = SEVERITY_STYLE.get(f.severity, "")
        evidence = "\n".join(f"{k}: {v}" for k, v in f.evidence.items())
        table.add_row(f"[{style}]{f.severity}[/{style}]", f.id, f.message, evidence, f.remedy)
    return table
