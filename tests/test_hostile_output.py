"""What a person reads, at 80 columns (a log file, CI, a narrow terminal), with values from
hosts as they come: no line over 80 characters, no cell cut to "…", key fingerprints whole,
text from hosts printed as text (never markup) with its control characters escaped.

Every table the inventory and doctor draw is rendered here; the facts are the real H200
capture (tests/facts/inventory) plus venvs and errors with long and hostile values.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

from ddtree_deploy.cli.render_inventory import (
    failures,
    findings_table,
    gpu_table,
    remedies,
    venv_table,
)
from ddtree_deploy.cli.render_table import add_row, make_table
from ddtree_deploy.errors import HostKeyError
from ddtree_deploy.facts.model import (
    Extension,
    Facts,
    Gpu,
    GpuProcess,
    NvidiaInfo,
    TorchInfo,
    Venv,
)
from ddtree_deploy.rules.findings import Finding
from ddtree_deploy.transport.fanout import Outcome

CAPTURE = Path(__file__).parent / "facts" / "inventory" / "h200-cu130-nvml.json"
FINGERPRINT = "SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8"
HOSTILE = "/opt/x[/x]/[bold]v[/bold]/\x1b[2Jenv"
VERSIONS = {"sglang": "0.5.11", "sglang-kernel": "0.4.2.post1", "flashinfer-python": "0.6.3",
            "xgrammar": "0.1.27", "soundfile": "0.13.1"}


def _render(*items: RenderableType, width: int = 80) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, legacy_windows=False)
    for item in items:
        con.print(item)
    return buf.getvalue()


def _facts() -> list[Outcome[Facts]]:
    real = Facts.model_validate(json.loads(CAPTURE.read_text())["output"][0])
    long_path = "/srv/very/long/folder/names/of/a/shared/gpu/host/venvs/sglang-ddtree-cu130-py311"
    extra = [
        Venv(path=long_path, declared=True, python_version="3.11.2",
             torch=TorchInfo(version="2.11.0+cu130", cuda="13.0"), distributions=VERSIONS),
        Venv(path=HOSTILE, declared=False, python_version="3.11.2",
             torch=TorchInfo(version="2.9.1+cu128", cuda="12.8"), distributions=VERSIONS,
             extensions=[Extension(path="sgl_kernel/common_ops.abi3.so", cuda_majors=[13],
                                   needed=["libcudart.so.13"])]),
        Venv(path="/opt/gone", declared=True, exists=False),
    ]
    gpus = [Gpu(index=0, name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                compute_cap="12.0", memory_used_mib=1234, memory_total_mib=97887,
                processes=[GpuProcess(pid=4242, ports=[30000], unit="qwen-wrapper.service")]),
            Gpu(index=1, name="NVIDIA RTX A6000", dead=True,
                error="temperature: Unknown Error; pstate: Unknown Error")]
    story = real.model_copy(update={
        "host": "ct200", "venvs": [*real.venvs, *extra],
        "nvidia": NvidiaInfo(present=True, driver_version="580.159.04", cuda_version="13.0",
                             gpus=gpus)})
    changed = HostKeyError(
        f"ct129 (10.77.129.2:22): the host key CHANGED: known_hosts line 3 has ssh-ed25519 "
        f"{FINGERPRINT}, the host offers ssh-ed25519 "
        f"SHA256:Zx0Yq2Vb7CwT9mK4sR1uLp8eN3jH6fG5dA0oI2kQwEr. Refusing to connect.")
    return [Outcome("ct200", value=story), Outcome("h200", value=real),
            Outcome("ct129", error=changed)]


def _assert_readable(text: str) -> None:
    long = [line for line in text.splitlines() if len(line) > 80]
    assert long == [], long
    assert "…" not in text
    assert "\x1b" not in text  # no raw ESC reaches the terminal


def _flat(text: str) -> str:
    """Each body column's text read down the table, spaces dropped (a cell that wrapped or
    folded reads whole), columns one per line; and every line outside the tables."""
    columns: dict[int, list[str]] = {}
    outside = []
    for line in text.splitlines():
        if line.startswith("│"):
            for i, part in enumerate(line.strip("│").split("│")):
                columns.setdefault(i, []).append(part.replace(" ", ""))
        elif not line.startswith(("┏", "┃", "┡", "└")):
            outside.append(line.replace(" ", ""))
    return "\n".join(["".join(parts) for _, parts in sorted(columns.items())] + outside)


def test_gpu_table_and_failures_at_80_columns() -> None:
    outcomes = _facts()
    text = _render(gpu_table(outcomes), *failures(outcomes))
    _assert_readable(text)
    assert FINGERPRINT in text  # whole, on one line, in the failure under the table
    assert "SHA256:Zx0Yq2Vb7CwT9mK4sR1uLp8eN3jH6fG5dA0oI2kQwEr" in text
    flat = _flat(text)
    for value in ("RTXPRO6000BlackwellWorkstationEdition", "1234/97887", "pid4242port30000",
                  "(qwen-wrapper.service)", "DEADUnknownError", "580.159.04/13.0"):
        assert value in flat, value


@pytest.mark.parametrize("width", [80, 100, 160])
def test_venv_table_keeps_every_cell_whole(width: int) -> None:
    text = _render(venv_table(_facts(), width=width), width=width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), [ln for ln in lines if len(ln) > width]
    assert "…" not in text and "\x1b" not in text
    flat = _flat(text)
    assert "/srv/very/long/folder/names/of/a/shared/gpu/host/venvs/sglang-ddtree-cu130-py311" \
        in flat
    assert "/opt/x[/x]/[bold]v[/bold]/\\x1b[2Jenv(found)" in flat  # as text, ESC escaped
    assert "MIXEDcu12+cu13" in flat and "missing" in flat
    for version in VERSIONS.values():
        assert version in flat


def test_findings_table_at_80_columns() -> None:
    findings = [
        Finding(id="torch.lane.mismatch", severity="error",
                message=f"torch in {HOSTILE} is built for CUDA 12.8 but sgl_kernel needs 13",
                evidence={"torch": "2.9.1+cu128", "sgl_kernel": "libcudart.so.13"},
                remedy="ddtree-deploy overlay --abi cu130 --to ct200 --venv "
                       "/srv/very/long/folder/names/venvs/sglang-ddtree-cu130-py311"),
    ]
    text = _render(findings_table("ct200", HOSTILE, findings))
    _assert_readable(text)
    flat = _flat(text)
    assert "torch.lane.mismatch" in flat and "[/x]/[bold]v[/bold]/\\x1b[2Jenv" in flat
    (remedy,) = remedies(findings)  # under the table, whole: one line (soft-wrapped)
    assert remedy.plain == f"fix torch.lane.mismatch: {findings[0].remedy}"


def test_any_table_cell_is_text_not_markup() -> None:
    table = make_table("[bold]title[/bold] [/x]", ("a", "b"))
    add_row(table, "[red]not red[/red]", "\x07bell\x9b")
    text = _render(table)
    assert "[bold]title[/bold] [/x]" in text and "[red]not red[/red]" in text
    assert "\\x07bell\\x9b" in text


def test_overlay_plan_table_at_80_columns() -> None:
    from test_overlay_plan import TORCH_NEW, TORCH_OLD, _dist, _lane, _venv

    from ddtree_deploy.overlay.plan import plan
    from ddtree_deploy.overlay.render import render_plan

    src = _venv("/opt/source/venvs/[bold]cu130[/bold]-with-a-long-name",
                _dist("torch", "2.11.0", TORCH_NEW))
    dst = _venv("/srv/very/long/folder/names/venvs/sglang-ddtree-cu130-py311",
                _dist("torch", "2.11.0+cu128", TORCH_OLD),
                _dist("nvidia-cuda-nvrtc-cu12", "12.8.93", {"nvidia/cuda_nvrtc/lib/x.so.12": b"c"}))
    p = plan(_lane(), src, dst, set(), target_host="ct200")
    buf = io.StringIO()
    render_plan(p, Console(file=buf, width=80, color_system=None, legacy_windows=False))
    text = buf.getvalue()
    _assert_readable(text)
    flat = _flat(text)
    assert "2.11.0+cu128->2.11.0" in flat and "nvidia-cuda-nvrtc-cu12" in flat
    assert "[bold]cu130[/bold]" in text.replace("\n", "") and p.id in text
