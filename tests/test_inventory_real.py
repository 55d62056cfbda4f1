"""Inventory output captured on a real GPU host, read back through the tool's own models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_deploy.facts.model import Facts
from ddtree_deploy.rules.engine import diagnose
from ddtree_deploy.rules.venv_lane import lane

FIXTURES = Path(__file__).parent / "facts" / "inventory"
# First session's probe (CUDA version from nvidia-smi's table), the second's (from libcuda,
# with the host memo reused) and the third's (GPUs from NVML, sockets from netlink): the same
# host must read the same every way.
CASES = ["h200-cu130", "h200-cu130-memo", "h200-cu130-nvml"]


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def load(case: str) -> Facts:
    data = json.loads((FIXTURES / f"{case}.json").read_text())
    assert "H200" in data["source"]
    (host,) = data["output"]
    return Facts.model_validate(host)


def test_the_memo_run_reused_everything_and_reads_as_the_first() -> None:
    first, memo = load(CASES[0]), load(CASES[1])
    assert memo.probe_memo.hits > 0 and memo.probe_memo.misses == 0
    assert memo.probe_memo.error is None
    assert (memo.nvidia.driver_version, memo.nvidia.cuda_version) == (
        first.nvidia.driver_version, first.nvidia.cuda_version)
    a, b = first.venv("/opt/torch/.venv"), memo.venv("/opt/torch/.venv")
    assert a is not None and b is not None
    assert a.distributions == b.distributions and a.torch == b.torch and a.nvidia == b.nvidia
    assert sorted(e.path for e in a.extensions) == sorted(e.path for e in b.extensions)


def test_nvml_reads_as_nvidia_smi_did() -> None:
    smi, nvml = load(CASES[1]), load(CASES[2])
    assert (smi.nvidia.source, nvml.nvidia.source) == (None, "nvml")  # None: before the field
    assert nvml.probe_memo.hits > 0 and nvml.probe_memo.misses == 0
    assert (nvml.nvidia.driver_version, nvml.nvidia.cuda_version) == (
        smi.nvidia.driver_version, smi.nvidia.cuda_version)
    fields = ("index", "name", "memory_total_mib", "compute_cap", "pci_bus_id", "dead", "error")
    assert [[getattr(g, f) for f in fields] for g in smi.nvidia.gpus] == [
        [getattr(g, f) for f in fields] for g in nvml.nvidia.gpus]
    assert [(s.port, s.address) for s in smi.services.listeners] == [
        (s.port, s.address) for s in nvml.services.listeners]
    a, b = smi.venv("/opt/torch/.venv"), nvml.venv("/opt/torch/.venv")
    assert a is not None and b is not None
    assert a.distributions == b.distributions and a.torch == b.torch and a.nvidia == b.nvidia
    assert sorted(e.path for e in a.extensions) == sorted(e.path for e in b.extensions)


def test_h200_gpu_and_driver(case: str) -> None:
    facts = load(case)
    assert facts.nvidia.driver_version is not None
    assert facts.nvidia.driver_version.startswith("580.")
    assert facts.nvidia.cuda_version == "13.0"
    (gpu,) = facts.nvidia.gpus
    assert gpu.name == "NVIDIA H200" and gpu.compute_cap == "9.0" and not gpu.dead
    assert gpu.memory_total_mib == 143771


def test_h200_torch_venv_is_cu130_with_its_library_folders(case: str) -> None:
    venv = load(case).venv("/opt/torch/.venv")
    assert venv is not None and venv.torch is not None
    assert venv.torch.version == "2.11.0+cu130" and venv.torch.cuda == "13.0"
    assert venv.torch.dist_version == "2.11.0"  # the dist-info says no local tag
    assert venv.nvidia.cu13 and venv.nvidia.cu12_components == []
    assert set(venv.nvidia.other) >= {"cudnn", "nccl", "nvshmem", "cusparselt"}
    assert any(d.endswith("site-packages/nvidia/cu13/lib") for d in venv.nvidia.lib_dirs)
    report = lane(venv)
    assert report.lane == "cu130" and not report.mixed and report.majors == {13}
    assert any(e.path.startswith("torch/lib/libtorch_cuda") for e in venv.extensions)


def test_h200_torch_venv_has_no_errors(case: str) -> None:
    facts = load(case)
    findings = diagnose(facts, venv="/opt/torch/.venv", deployment=None, model_facts=None)
    assert [f for f in findings if f.severity == "error"] == []
