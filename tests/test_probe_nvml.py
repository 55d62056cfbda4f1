"""GPU facts through NVML (remote/facts_nvml.py) must read the same as through nvidia-smi.

Here both come from the lab's stand-ins (no GPU on this machine): the libnvidia-ml stand-in
(lab/standin/csrc/libnvml.c) and the nvidia-smi stand-in, reading one GPU spec and one set of
claims. On the real H200 the two paths were compared the same way (idle and with a busy GPU:
the same driver, CUDA version, GPU fields and process; memory used differed by 1 MiB of rounding).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hang_guard import call_guarded, children, kill_left

from ddtree_deploy.facts.model import NvidiaInfo
from ddtree_deploy.remote import facts_sys
from ddtree_lab.standin import nvidia_smi

STANDIN_SMI = Path(nvidia_smi.__file__)
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _gpus(count: int, name: str, total: int, cc: str, dead: tuple[int, ...] = ()) -> list[Any]:
    return [{"index": i, "name": name, "uuid": f"GPU-{i}1111111-2222-3333-4444-5555",
             "pci_bus_id": f"00000000:0{i + 1}:00.0", "memory_total_mib": total,
             "compute_cap": cc, "power_limit_w": 300, "dead": i in dead}
            for i in range(count)]  # fmt: skip


CT129 = {"driver_version": "580.95.05", "cuda_version": "13.0",
         "gpus": _gpus(2, "NVIDIA RTX A6000", 49140, "8.6", dead=(1,))}  # fmt: skip
CT200 = {"driver_version": "580.95.05", "cuda_version": "13.0",
         "gpus": _gpus(8, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "12.0")}


@pytest.fixture(scope="module")
def libnvml(tmp_path_factory: pytest.TempPathFactory) -> str:
    from ddtree_lab.standin_wheels import build_libnvml

    return str(build_libnvml(tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"))


@pytest.fixture()
def gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A spec and a claims folder for both stand-ins, and nvidia-smi as a program."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN_SMI} "$@"\n')
    smi.chmod(0o755)
    claims = tmp_path / "claims"
    monkeypatch.setenv("DDTREE_LAB_GPU_SPEC", str(tmp_path / "gpus.json"))
    monkeypatch.setenv("DDTREE_LAB_GPU_CLAIMS", str(claims))
    return {"smi": str(smi), "spec": tmp_path / "gpus.json", "claims": str(claims)}


def both(gpu_host: dict[str, Any], lib: str, ports: dict[int, list[int]]) -> tuple[Any, Any]:
    via_nvml = facts_sys.nvidia_info(ports, smi=gpu_host["smi"], libcuda="/absent.so", nvml=lib)
    via_smi = facts_sys.nvidia_info(ports, smi=gpu_host["smi"], libcuda="/absent.so",
                                    nvml="/absent/libnvidia-ml.so.1")
    assert (via_nvml.pop("source"), via_smi.pop("source")) == ("nvml", "nvidia-smi")
    return via_nvml, via_smi


def test_dead_gpu_reads_the_same(gpu_host: dict[str, Any], libnvml: str) -> None:
    gpu_host["spec"].write_text(json.dumps(CT129))
    via_nvml, via_smi = both(gpu_host, libnvml, {})
    assert via_nvml == via_smi
    info = NvidiaInfo.model_validate(via_nvml)
    assert (info.present, info.driver_version, info.cuda_version) == (True, "580.95.05", "13.0")
    dead = info.gpus[1]
    assert dead.dead and not info.gpus[0].dead
    assert dead.error == ("temperature.gpu: Unknown Error; utilization.gpu: Unknown Error; "
                          "pstate: Unknown Error")
    assert (dead.memory_total_mib, dead.memory_used_mib, dead.compute_cap) == (49140, 0, "8.6")


def test_busy_gpu_reads_the_same(gpu_host: dict[str, Any], libnvml: str) -> None:
    """A live claim (a real process) on GPU0, a claim whose process has ended on GPU1, and a
    claim on a GPU the spec does not have: only the live one counts, in both."""
    gpu_host["spec"].write_text(json.dumps(CT200))
    server, other = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        nvidia_smi.write_claim(0, 86140, "python3", gpu_host["claims"], pid=server.pid)
        nvidia_smi.write_claim(1, 5000, "python3", gpu_host["claims"], pid=gone.pid)
        nvidia_smi.write_claim(9, 5000, "python3", gpu_host["claims"], pid=other.pid)
        via_nvml, via_smi = both(gpu_host, libnvml, {server.pid: [30000]})
    finally:
        for proc in (server, other):
            proc.kill()
            proc.wait()
    assert via_nvml == via_smi
    info = NvidiaInfo.model_validate(via_nvml)
    busy = info.gpus[0]
    assert busy.memory_used_mib == 86140 + 9  # the claim plus the driver's baseline
    assert [(p.pid, p.name, p.used_mib, p.ports) for p in busy.processes] == [
        (server.pid, "python3", 86140, [30000])]
    assert all(g.processes == [] and g.memory_used_mib == 0 for g in info.gpus[1:])
    assert len(info.gpus) == 8 and {g.compute_cap for g in info.gpus} == {"12.0"}


def test_no_driver_falls_back_to_nvidia_smi(gpu_host: dict[str, Any], libnvml: str) -> None:
    """NVML that does not start (here: no GPU spec, the stand-in's "driver not loaded") hands
    over to nvidia-smi, whose own message says why."""
    info = facts_sys.nvidia_info({}, smi=gpu_host["smi"], libcuda="/absent.so", nvml=libnvml)
    assert info["source"] == "nvidia-smi" and not info["present"]
    assert "couldn't communicate with the NVIDIA driver" in info["error"]


def test_memory_v1_counts_the_reserve(gpu_host: dict[str, Any], libnvml: str) -> None:
    """Drivers without the v2 memory call: the v1 call's "used" includes the driver's reserve
    (as on real drivers); the probe prefers v2, which is what nvidia-smi shows."""
    import ctypes

    from ddtree_deploy.remote import facts_nvml

    gpu_host["spec"].write_text(json.dumps(CT129))
    nvml = facts_nvml.load_nvml(libnvml)
    assert nvml is not None
    handle = ctypes.c_void_p()
    assert nvml.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
    v1, v2 = facts_nvml._Memory(), facts_nvml._MemoryV2(version=facts_nvml.MEMORY_V2)
    assert nvml.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(v1)) == 0
    assert nvml.lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(v2)) == 0
    reserve = 49140 * 615 // 143771
    assert (v2.used, v2.reserved // facts_nvml.MIB) == (0, reserve)
    assert v1.used // facts_nvml.MIB == reserve and v1.total == v2.total
    wrong = facts_nvml._MemoryV2(version=1)
    assert nvml.lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(wrong)) != 0
    nvml.lib.nvmlShutdown()


def test_a_stuck_driver_costs_the_gpu_facts_only(gpu_host: dict[str, Any], libnvml: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML is asked in a forked child: one that does not answer in time is left behind (a
    process stuck in the kernel cannot be killed) and the GPU part says so; nvidia-smi is not
    asked then (it would be stuck on the same driver)."""
    from ddtree_deploy.remote.facts_nvml import nvml_info_bounded

    gpu_host["spec"].write_text(json.dumps(CT129))
    monkeypatch.setenv("DDTREE_LAB_NVML_HANG", "600")  # far past the test's hang guard
    before = children(os.getpid())
    try:
        info = call_guarded(
            lambda: nvml_info_bounded({}, facts_sys.proc_unit, libnvml, timeout=0.5),
            "nvml_info_bounded")
        assert info is not None and not info["present"] and info["gpus"] == []
        assert info["error"] == "NVML did not answer within 0.5s"
    finally:
        kill_left(children(os.getpid()) - before)  # the child left behind, still in nvmlInit


def test_a_crashing_library_hands_over_to_nvidia_smi(gpu_host: dict[str, Any], libnvml: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import faulthandler

    gpu_host["spec"].write_text(json.dumps(CT129))
    monkeypatch.setenv("DDTREE_LAB_NVML_CRASH", "1")
    was_on = faulthandler.is_enabled()
    faulthandler.disable()  # pytest's would report the child's abort on the test's stderr
    try:
        info = facts_sys.nvidia_info({}, smi=gpu_host["smi"], libcuda="/absent.so",
                                     nvml=libnvml)
    finally:
        if was_on:
            faulthandler.enable()
    assert info["source"] == "nvidia-smi" and info["present"] and len(info["gpus"]) == 2
    assert info["gpus"][1]["dead"]
