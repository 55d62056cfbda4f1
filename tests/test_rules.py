"""doctor's rules: the story's hosts give exactly the expected findings; each rule fires and not.

Facts are built here as the probe would report them. Values quoted from real sources:
- sglang-kernel 0.4.2's objects need libcudart.so.13, libnvrtc.so.13, libcublas.so.13
  (/work/shared/fixtures/real/sglang-kernel-0.4.2-pypi/readelf-d.txt);
- torch 2.11.0+cu130 reports cuda "13.0" (fixtures/real/h200-cu130/torch.json), torch 2.9.1 of
  the registry reports "12.8" (fixtures/real/torch-2.9.1-cu128-pypi/version.py.txt);
- the H200 driver line "580.159.04" (fixtures/real/h200-cu130/proc-driver-version.txt).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.config.hosts import Deployment, load_config
from ddtree_deploy.facts.model import (
    Extension,
    Facts,
    Gpu,
    GpuProcess,
    HostInfo,
    Listener,
    NvidiaInfo,
    NvidiaLayout,
    Services,
    SglangInfo,
    TorchInfo,
    Unit,
    Venv,
)
from ddtree_deploy.rules import (
    Finding,
    ModelFacts,
    diagnose,
    exit_code,
    expected_width,
    lane,
    lane_from_cuda,
)
from ddtree_deploy.rules.floors import SGLANG_PINS, all_sources

HOSTS = Path(__file__).resolve().parent.parent / "hosts.yaml"
CU13_KERNEL = ["libcudart.so.13", "libnvrtc.so.13", "libcublas.so.13", "libcublasLt.so.13"]
CU12_KERNEL = ["libcudart.so.12", "libnvrtc.so.12", "libcublas.so.12"]
FLASHINFER_NEW = ["mm_mxfp8", "bmm_mxfp8", "mxfp8_quantize"]
FLASHINFER_OLD = ["bmm_mxfp8", "mxfp8_quantize"]  # 0.6.3's __init__.py exports no mm_mxfp8
XGRAMMAR_NEW = ["StructuralTag", "StructuralTagItem", "GrammarCompiler"]
XGRAMMAR_OLD = ["GrammarCompiler"]  # 0.1.10 has neither StructuralTag nor StructuralTagItem


@pytest.fixture(scope="module")
def dep() -> Deployment:
    return load_config(HOSTS).deployment("sglang-ddtree")


def ext(path: str, dist: str, needed: list[str]) -> Extension:
    majors = sorted({int(n.rsplit(".", 1)[1]) for n in needed if n.startswith("libcudart")})
    return Extension(path=path, distribution=dist, needed=needed, cuda_majors=majors)


def venv_sglang() -> Venv:
    """ct200's failed first try: PyPI sglang 0.5.10 with old flashinfer and xgrammar."""
    return Venv(
        path="/root/venv_sglang", python_version="3.11.2",
        distributions={"sglang": "0.5.10", "torch": "2.9.1", "sglang-kernel": "0.4.1",
                       "flashinfer-python": "0.6.3", "xgrammar": "0.1.10"},
        torch=TorchInfo(version="2.9.1+cu128", cuda="12.8", dist_version="2.9.1"),
        extensions=[ext("sgl_kernel/sm90/common_ops.abi3.so", "sglang-kernel", CU12_KERNEL)],
        nvidia=NvidiaLayout(cu12_components=["cuda_runtime", "cublas", "cuda_nvrtc"]),
        sglang=SglangInfo(version="0.5.10", spec_algorithms=["EAGLE", "EAGLE3", "NONE"],
                          knows_ddtree=False, ddtree_is_dflash=None),
        names={"flashinfer": FLASHINFER_OLD, "xgrammar": XGRAMMAR_OLD},
    )  # fmt: skip


def venv_training() -> Venv:
    return Venv(
        path="/root/venv", declared=True, python_version="3.11.2",
        distributions={"torch": "2.11.0"},
        torch=TorchInfo(version="2.11.0+cu128", cuda="12.8", dist_version="2.11.0"),
        extensions=[ext("torch/lib/libtorch_cuda.so", "torch", ["libcudart.so.12"])],
        nvidia=NvidiaLayout(cu12_components=["cuda_runtime", "cublas"]),
    )  # fmt: skip


def venv_healthy(path: str = "/root/venv_sglang211", ddtree: bool = True) -> Venv:
    """The 0.5.11 set on the cu130 lane, with the DDTree payload (or without: ct129)."""
    return Venv(
        path=path, declared=True, python_version="3.11.2",
        distributions={"sglang": "0.5.11", "torch": "2.11.0", "sglang-kernel": "0.4.2",
                       "flashinfer-python": "0.6.8.post1", "xgrammar": "0.1.32",
                       "soundfile": "0.13.1"},
        torch=TorchInfo(version="2.11.0+cu130", cuda="13.0", dist_version="2.11.0"),
        extensions=[ext("sgl_kernel/sm90/common_ops.abi3.so", "sglang-kernel", CU13_KERNEL),
                    ext("torch/lib/libtorch_cuda.so", "torch", ["libcudart.so.13"])],
        nvidia=NvidiaLayout(cu13=True, other=["cudnn", "nccl", "nvshmem", "cusparselt"]),
        sglang=SglangInfo(
            version="0.5.11",
            dflash_modules=["dflash_worker.py", "dflash_info.py", "dflash_utils.py"],
            ddtree_modules=["ddtree_worker.py"] if ddtree else [],
            spec_algorithms=["DFLASH", "EAGLE", "NONE", *(["DDTREE"] if ddtree else [])],
            knows_ddtree=ddtree, ddtree_is_dflash=True if ddtree else None),
        names={"flashinfer": FLASHINFER_NEW, "xgrammar": XGRAMMAR_NEW},
    )  # fmt: skip


def ct200(*venvs: Venv, **changes: Any) -> Facts:
    """8x RTX PRO 6000 Blackwell (SM 12.0); GPU0 busy serving port 30000 (PID 4242)."""
    gpus = [
        Gpu(index=i, name="NVIDIA RTX PRO 6000 Blackwell Server Edition", compute_cap="12.0",
            memory_total_mib=97887,
            processes=[GpuProcess(pid=4242, name="python3", used_mib=90112, ports=[30000])]
            if i == 0 else [])
        for i in range(8)
    ]  # fmt: skip
    facts = Facts(
        host="ct200",
        host_info=HostInfo(glibc="2.36", python="3.11.2", os="Debian GNU/Linux 12 (bookworm)"),
        nvidia=NvidiaInfo(present=True, driver_version="580.95.05", cuda_version="13.0", gpus=gpus),
        venvs=list(venvs),
        services=Services(
            listeners=[Listener(port=30000, address="0.0.0.0", pid=4242, process="python3")]
        ),
    )
    return facts.model_copy(update=changes)


def ct129() -> Facts:
    gpus = [
        Gpu(index=0, name="NVIDIA RTX A6000", compute_cap="8.6", memory_total_mib=49140),
        Gpu(index=1, name="NVIDIA RTX A6000", compute_cap="8.6", dead=True,
            error="cudaErrorDevicesUnavailable", memory_used_mib=0),
    ]  # fmt: skip
    return Facts(
        host="ct129",
        host_info=HostInfo(glibc="2.36", python="3.11.2"),
        nvidia=NvidiaInfo(
            present=True, driver_version="580.159.04", cuda_version="13.0", gpus=gpus
        ),
        venvs=[venv_healthy("/root/ml-env", ddtree=False)],
    )


def ids(findings: list[Finding]) -> list[str]:
    return [f.id for f in findings]


def only(findings: list[Finding], fid: str) -> Finding:
    hits = [f for f in findings if f.id == fid]
    assert len(hits) == 1, ids(findings)
    return hits[0]


def models(**changes: Any) -> ModelFacts:
    """Qwen3.6-27B (hidden 5120, 64 layers) and its b16 DFlash drafter reading 5 layers."""
    base = ModelFacts(
        target_path="/dev/shm/Qwen3.6-27B", draft_path="/dev/shm/Qwen3.6-27B-DFlash-b16",
        target_config={"text_config": {"hidden_size": 5120, "num_hidden_layers": 64}},
        draft_config={"hidden_size": 5120, "num_hidden_layers": 5, "block_size": 16,
                      "dflash_config": {"target_layer_ids": [1, 15, 30, 45, 60]}},
    )  # fmt: skip
    return base.model_copy(update=changes)


# ---- the story


def test_story_ct200_venv_sglang_with_the_ddtree_deployment(dep: Deployment) -> None:
    facts = ct200(venv_training(), venv_sglang())
    found = diagnose(facts, venv="/root/venv_sglang", deployment=dep, model_facts=None)
    assert sorted(ids(found)) == sorted([
        "deploy.lane-mismatch", "deploy.sglang-version", "deploy.no-dflash",
        "venv.flashinfer-mxfp8", "venv.soundfile-missing", "venv.pin-drift",
        "venv.xgrammar-structural-tag", "venv.flashinfer-sm12",
        "deploy.open-endpoint",  # 0.0.0.0 and no API key (issue 30, item 6)
    ])  # fmt: skip
    severities = {f.id: f.severity for f in found}
    assert severities["venv.xgrammar-structural-tag"] == "info"  # --grammar-backend none
    assert severities["venv.flashinfer-sm12"] == "info"  # --attention-backend triton
    assert severities["venv.pin-drift"] == "warning"
    assert [f.severity for f in found] == sorted(
        (f.severity for f in found), key=["error", "warning", "info"].index
    )
    assert exit_code(found) == 1
    lane_f = only(found, "deploy.lane-mismatch")
    assert lane_f.evidence["venv_lane"] == "cu128" and lane_f.evidence["deployment_lane"] == "cu130"
    assert "overlay --abi cu130 --to ct200 --venv /root/venv_sglang`" in lane_f.remedy
    assert only(found, "venv.flashinfer-mxfp8").evidence["flashinfer-python"] == "0.6.3"


def test_story_ct200_without_deployment_checks_what_the_venv_needs() -> None:
    found = diagnose(ct200(venv_sglang()), venv="/root/venv_sglang", deployment=None,
                     model_facts=None)  # fmt: skip
    by_id = {f.id: f.severity for f in found}
    assert by_id == {
        "venv.flashinfer-mxfp8": "error", "venv.soundfile-missing": "error",
        "venv.xgrammar-structural-tag": "error", "venv.flashinfer-sm12": "warning",
        "venv.pin-drift": "warning",
    }  # fmt: skip
    assert not any(f.id.startswith(("deploy.", "payload.")) for f in found)


def test_story_ct129_dead_gpu1() -> None:
    found = diagnose(ct129(), venv=None, deployment=None, model_facts=None)
    assert ids(found) == ["gpu.dead"]
    assert found[0].evidence["index"] == 1 and found[0].severity == "warning"
    assert exit_code(found) == 0


def test_healthy_cu130_venv_has_no_errors(dep: Deployment) -> None:
    facts = ct200(venv_training(), venv_healthy())
    found = diagnose(facts, venv="/root/venv_sglang211", deployment=dep, model_facts=models())
    assert ids(found) == ["deploy.open-endpoint", "model.fit"]  # 0.0.0.0 without a key: warned
    keyed = dep.model_copy(update={"api_key_file": Path("/ws/key")})
    healthy = venv_healthy()  # its key goes through --config, read with PyYAML
    healthy = healthy.model_copy(update={"distributions": {**healthy.distributions,
                                                           "pyyaml": "6.0.2"}})
    facts = ct200(venv_training(), healthy)
    found = diagnose(facts, venv="/root/venv_sglang211", deployment=keyed, model_facts=models())
    assert [f for f in found if f.severity != "info"] == []
    assert ids(found) == ["model.fit"]
    assert found[0].evidence["expected_hidden_width"] == 25_600
    assert exit_code(found) == 0


def test_without_venv_or_deployment_every_venv_is_checked() -> None:
    found = diagnose(ct200(venv_training(), venv_sglang(), venv_healthy()), venv=None,
                     deployment=None, model_facts=None)  # fmt: skip
    assert {f.evidence.get("venv") for f in found} == {"/root/venv_sglang"}


def test_deterministic_and_order_independent(dep: Deployment) -> None:
    a = diagnose(ct200(venv_training(), venv_sglang()), venv="/root/venv_sglang", deployment=dep,
                 model_facts=models(draft_config=None))  # fmt: skip
    b = diagnose(ct200(venv_sglang(), venv_training()), venv="/root/venv_sglang", deployment=dep,
                 model_facts=models(draft_config=None))  # fmt: skip
    assert [f.to_json() for f in a] == [f.to_json() for f in b]
    assert set(a[0].to_json()) == {"id", "severity", "message", "evidence", "remedy", "commands"}
    json.dumps([f.to_json() for f in a])  # --json prints them: evidence must be plain JSON
    assert all(f.remedy for f in a if f.severity == "error")


# ---- lane


def test_lane_from_cuda() -> None:
    assert lane_from_cuda("12.8") == "cu128"
    assert lane_from_cuda("13.0") == "cu130"
    assert lane_from_cuda(None) is None
    assert lane_from_cuda("cpu") is None


def test_lane_clean_cu130_and_cu128() -> None:
    report = lane(venv_healthy())
    assert (report.lane, report.mixed, set(report.majors)) == ("cu130", False, {13})
    assert report.evidence["sgl_kernel/sm90/common_ops.abi3.so"] == sorted(CU13_KERNEL)
    assert lane(venv_training()).lane == "cu128" and not lane(venv_training()).mixed


def test_lane_torch_cu128_with_cuda13_kernel_is_mixed() -> None:
    v = venv_healthy().model_copy(
        update={"torch": TorchInfo(version="2.11.0+cu128", cuda="12.8", dist_version="2.11.0")}
    )
    report = lane(v)
    assert report.mixed and report.lane == "cu128" and set(report.majors) == {12, 13}


def test_lane_both_layouts_mixed_only_when_both_are_needed() -> None:
    both = NvidiaLayout(cu12_components=["cuda_runtime"], cu13=True)
    no_torch = venv_healthy().model_copy(update={"torch": None, "nvidia": both})
    assert not lane(no_torch).mixed  # leftover cu12 folders, nothing needs them
    needs_both = no_torch.model_copy(
        update={
            "extensions": [
                ext("a.so", "x", ["libcudart.so.12"]),
                ext("b.so", "y", ["libcudart.so.13"]),
            ]
        }
    )
    report = lane(needs_both)
    assert report.mixed and "nvidia/" in report.evidence


def test_lane_reads_local_tag_when_cuda_missing() -> None:
    v = venv_training().model_copy(update={"torch": TorchInfo(version="2.11.0+cu130")})
    assert lane(v).lane == "cu130"


# ---- host rules


def test_driver_too_old_for_cu130() -> None:
    old = ct200(venv_healthy()).nvidia.model_copy(update={"driver_version": "570.86.10"})
    found = diagnose(ct200(venv_healthy(), nvidia=old), venv=None, deployment=None,
                     model_facts=None)  # fmt: skip
    f = only(found, "driver.too-old")
    assert f.evidence["lane"] == "cu130" and f.severity == "error"
    assert "driver.too-old" not in ids(diagnose(ct200(venv_healthy()), venv=None,
                                                deployment=None, model_facts=None))  # fmt: skip
    # the cu128 training venv is fine on 570
    assert diagnose(ct200(venv_training(), nvidia=old), venv=None, deployment=None,
                    model_facts=None) == []  # fmt: skip


def test_driver_floor_follows_the_deployment_lane(dep: Deployment) -> None:
    old = ct200().nvidia.model_copy(update={"driver_version": "575.51.03"})
    found = diagnose(ct200(venv_training(), nvidia=old), venv="/root/venv", deployment=dep,
                     model_facts=None)  # fmt: skip
    assert "deployment sglang-ddtree" in only(found, "driver.too-old").evidence["needed_by"]


def test_nvidia_absent() -> None:
    facts = ct200(nvidia=NvidiaInfo(present=False, error="nvidia-smi: not found"))
    assert ids(diagnose(facts, venv=None, deployment=None, model_facts=None)) == ["nvidia.absent"]
    assert diagnose(ct200(), venv=None, deployment=None, model_facts=None) == []


# ---- venv rules


def test_venv_missing_and_unreadable(dep: Deployment) -> None:
    found = diagnose(ct200(venv_training()), venv="/root/venv_sglang211", deployment=dep,
                     model_facts=None)  # fmt: skip
    f = only(found, "venv.missing")
    assert "venv clone ct200 SOURCE /root/venv_sglang211`" in f.remedy and f.evidence["known_venvs"]
    gone = Venv(path="/root/x", exists=False)
    assert "venv.missing" in ids(diagnose(ct200(gone), venv="/root/x", deployment=None,
                                          model_facts=None))  # fmt: skip
    bad = venv_training().model_copy(update={"error": "site-packages: permission denied"})
    assert ids(diagnose(ct200(bad), venv="/root/venv", deployment=None, model_facts=None)) == [
        "venv.unreadable"
    ]
    assert diagnose(ct200(venv_training()), venv="/root/venv/", deployment=None,
                    model_facts=None) == []  # fmt: skip


def test_lane_mix_rule() -> None:
    mixed = venv_healthy().model_copy(
        update={"torch": TorchInfo(version="2.11.0+cu128", cuda="12.8", dist_version="2.11.0")}
    )
    found = diagnose(ct200(mixed), venv=mixed.path, deployment=None, model_facts=None)
    f = only(found, "venv.lane-mix")
    assert f.severity == "error" and "--abi cu130" in f.remedy
    assert "sgl_kernel/sm90/common_ops.abi3.so" in f.evidence["files"]
    assert "venv.lane-mix" not in ids(diagnose(ct200(venv_healthy()), venv=None,
                                               deployment=None, model_facts=None))  # fmt: skip


def test_kernel_torch_pin() -> None:
    dists = {**venv_healthy().distributions, "torch": "2.9.1"}
    v = venv_healthy().model_copy(update={"distributions": dists, "torch": TorchInfo(
        version="2.9.1+cu130", cuda="13.0", dist_version="2.9.1")})  # fmt: skip
    f = only(diagnose(ct200(v), venv=v.path, deployment=None, model_facts=None),
             "venv.kernel-torch")  # fmt: skip
    assert f.severity == "error" and f.evidence["kernel_needs_torch"] == "2.11.0"
    # 0.4.1 declares no torch pin: inferred from sglang's co-pin, so only a warning
    old = venv_sglang().model_copy(update={"torch": TorchInfo(version="2.11.0+cu128",
                                                              cuda="12.8")})  # fmt: skip
    f = only(diagnose(ct200(old), venv=old.path, deployment=None, model_facts=None),
             "venv.kernel-torch")  # fmt: skip
    assert f.severity == "warning"
    assert "venv.kernel-torch" not in ids(diagnose(ct200(venv_sglang()), venv=None,
                                                   deployment=None, model_facts=None))  # fmt: skip


def test_pin_drift_respects_the_deployment_extra_packages(dep: Deployment) -> None:
    newer = {**venv_healthy().distributions, "flashinfer-python": "0.6.9"}
    v = venv_healthy().model_copy(update={"distributions": newer})
    alone = diagnose(ct200(v), venv=v.path, deployment=None, model_facts=None)
    assert only(alone, "venv.pin-drift").evidence["drift"] == {
        "flashinfer-python": {"pinned": "0.6.8.post1", "installed": "0.6.9"}
    }
    # a deployment asking for flashinfer-python>=0.6.8.post1 wants 0.6.9: not drift
    wants_newer = dep.model_copy(update={"sglang": dep.sglang.model_copy(update={
        "extra_packages": ["soundfile==0.13.1", "flashinfer-python>=0.6.8.post1"]})})
    assert "venv.pin-drift" not in ids(diagnose(ct200(v), venv=v.path, deployment=wants_newer,
                                                model_facts=None))  # fmt: skip


def test_soundfile_missing() -> None:
    dists = {k: v for k, v in venv_healthy().distributions.items() if k != "soundfile"}
    v = venv_healthy().model_copy(update={"distributions": dists})
    f = only(diagnose(ct200(v), venv=v.path, deployment=None, model_facts=None),
             "venv.soundfile-missing")  # fmt: skip
    assert "soundfile==0.13.1" in f.remedy and "ddtree-deploy apply ct200" in f.remedy
    assert "venv.soundfile-missing" not in ids(
        diagnose(ct200(venv_training()), venv=None, deployment=None, model_facts=None)
    )


def test_flashinfer_mxfp8_only_on_blackwell() -> None:
    dists = {**venv_healthy().distributions, "flashinfer-python": "0.6.3"}
    old = venv_healthy().model_copy(
        update={"names": {"xgrammar": XGRAMMAR_NEW}, "distributions": dists}
    )
    assert only(diagnose(ct200(old), venv=old.path, deployment=None, model_facts=None),
                "venv.flashinfer-mxfp8").severity == "error"  # fmt: skip
    on_a6000 = ct129().model_copy(update={"venvs": [old]})
    assert "venv.flashinfer-mxfp8" not in ids(
        diagnose(on_a6000, venv=old.path, deployment=None, model_facts=None)
    )
    fixed = old.model_copy(update={"distributions": {**old.distributions,
                                                     "flashinfer-python": "0.6.4"}})  # fmt: skip
    assert "venv.flashinfer-mxfp8" not in ids(
        diagnose(ct200(fixed), venv=fixed.path, deployment=None, model_facts=None)
    )


def test_xgrammar_structural_tag(dep: Deployment) -> None:
    v = venv_healthy().model_copy(update={"names": {"flashinfer": FLASHINFER_NEW,
                                                    "xgrammar": XGRAMMAR_OLD}})  # fmt: skip
    f = only(diagnose(ct200(v), venv=v.path, deployment=None, model_facts=None),
             "venv.xgrammar-structural-tag")  # fmt: skip
    assert f.severity == "error" and "--grammar-backend none" in f.remedy
    assert f.evidence["needs"] == "StructuralTag"
    xg = dep.model_copy(update={"grammar_backend": "xgrammar"})
    assert only(diagnose(ct200(v), venv=v.path, deployment=xg, model_facts=None),
                "venv.xgrammar-structural-tag").severity == "error"  # fmt: skip
    assert only(diagnose(ct200(v), venv=v.path, deployment=dep, model_facts=None),
                "venv.xgrammar-structural-tag").severity == "info"  # fmt: skip
    assert "venv.xgrammar-structural-tag" not in ids(diagnose(
        ct200(venv_healthy()), venv=None, deployment=None, model_facts=None))  # fmt: skip


def test_flashinfer_sm12_follows_nvcc_and_the_backend(dep: Deployment) -> None:
    old_nvcc = Services(nvcc="/usr/local/cuda/bin/nvcc", nvcc_version="12.8")
    fi = dep.model_copy(update={"attention_backend": "flashinfer"})
    found = diagnose(ct200(venv_healthy(), services=old_nvcc), venv="/root/venv_sglang211",
                     deployment=fi, model_facts=None)  # fmt: skip
    f = only(found, "venv.flashinfer-sm12")
    assert f.severity == "error" and "--attention-backend triton" in f.remedy
    assert f.evidence["nvcc_version"] == "12.8"
    new_nvcc = Services(nvcc="/usr/local/cuda/bin/nvcc", nvcc_version="12.9")
    assert "venv.flashinfer-sm12" not in ids(diagnose(
        ct200(venv_healthy(), services=new_nvcc), venv="/root/venv_sglang211", deployment=fi,
        model_facts=None))  # fmt: skip
    on_a6000 = ct129().model_copy(update={"services": old_nvcc})
    assert "venv.flashinfer-sm12" not in ids(diagnose(on_a6000, venv=None, deployment=None,
                                                      model_facts=None))  # fmt: skip


# ---- deployment rules


def test_gpu_busy_by_another_process_but_not_by_its_own_service(dep: Deployment) -> None:
    on0 = dep.model_copy(update={"gpu": 0})
    f = only(diagnose(ct200(venv_healthy()), venv="/root/venv_sglang211", deployment=on0,
                      model_facts=None), "deploy.gpu-busy")  # fmt: skip
    assert f.evidence["processes"][0]["pid"] == 4242 and "--gpu 1" in f.remedy
    own = ct200(venv_healthy())
    own.nvidia.gpus[0].processes[0].unit = "sglang-ddtree.service"
    assert "deploy.gpu-busy" not in ids(
        diagnose(own, venv="/root/venv_sglang211", deployment=on0, model_facts=None)
    )
    by_pid = ct200(venv_healthy(), services=Services(units=[
        Unit(name="sglang-ddtree.service", active="active", main_pid=4242)]))  # fmt: skip
    assert "deploy.gpu-busy" not in ids(
        diagnose(by_pid, venv="/root/venv_sglang211", deployment=on0, model_facts=None)
    )


def test_gpu_dead_or_missing_in_deployment(dep: Deployment) -> None:
    on1 = dep.model_copy(update={"host": "ct129"})
    f = only(diagnose(ct129(), venv="/root/ml-env", deployment=on1, model_facts=None),
             "deploy.gpu-dead")  # fmt: skip
    assert "--gpu 0" in f.remedy
    on9 = dep.model_copy(update={"gpu": 9})
    assert "deploy.gpu-missing" in ids(
        diagnose(ct200(venv_healthy()), venv=None, deployment=on9, model_facts=None)
    )
    healthy = diagnose(ct200(venv_healthy()), venv=None, deployment=dep, model_facts=None)
    assert not {"deploy.gpu-dead", "deploy.gpu-missing", "deploy.gpu-busy"} & set(ids(healthy))


def test_port_taken(dep: Deployment) -> None:
    p30000 = dep.model_copy(update={"port": 30000})
    f = only(diagnose(ct200(), venv=None, deployment=p30000, model_facts=None),
             "deploy.port-taken")  # fmt: skip
    assert "--port 30001" in f.remedy and f.evidence["listeners"][0]["pid"] == 4242
    mine = ct200(services=Services(listeners=[Listener(
        port=30000, address="0.0.0.0", pid=4242, unit="sglang-ddtree.service")]))  # fmt: skip
    assert "deploy.port-taken" not in ids(diagnose(mine, venv=None, deployment=p30000,
                                                   model_facts=None))  # fmt: skip


def test_python_and_glibc_for_the_wheel(dep: Deployment) -> None:
    facts = ct200(venv_training(), host_info=HostInfo(glibc="2.31", python="3.13.1"))
    py313 = venv_training().model_copy(update={"python_version": "3.13.1"})
    found = diagnose(facts.model_copy(update={"venvs": [py313]}), venv="/root/venv",
                     deployment=dep, model_facts=None)  # fmt: skip
    assert only(found, "deploy.python").evidence["needs"] == "<3.13,>=3.10"
    assert only(found, "deploy.glibc").evidence["needs"] == "2.34"
    fine = diagnose(ct200(venv_training()), venv="/root/venv", deployment=dep, model_facts=None)
    assert not {"deploy.python", "deploy.glibc"} & set(ids(fine))


def test_sglang_version_and_missing(dep: Deployment) -> None:
    assert "deploy.sglang-missing" in ids(
        diagnose(ct200(venv_training()), venv="/root/venv", deployment=dep, model_facts=None)
    )
    assert not {"deploy.sglang-missing", "deploy.sglang-version"} & set(
        ids(
            diagnose(
                ct200(venv_healthy()), venv="/root/venv_sglang211", deployment=dep, model_facts=None
            )
        )
    )


def test_ddtree_payload_missing_and_not_dflash(dep: Deployment) -> None:
    plain = venv_healthy(ddtree=False)
    f = only(diagnose(ct200(plain), venv=plain.path, deployment=dep, model_facts=None),
             "payload.ddtree-missing")  # fmt: skip
    assert "payload deploy ct200 --venv /root/venv_sglang211" in f.remedy
    broken = venv_healthy()
    broken.sglang.ddtree_is_dflash = False  # type: ignore[union-attr]
    f = only(diagnose(ct200(broken), venv=broken.path, deployment=dep, model_facts=models()),
             "payload.ddtree-not-dflash")  # fmt: skip
    assert f.evidence["expected_hidden_width"] == 25_600 and "25,600" in f.message
    unknown = venv_healthy()
    unknown.sglang.knows_ddtree = None  # type: ignore[union-attr]
    unknown.sglang.spec_error = "spec_info.py: SyntaxError"  # type: ignore[union-attr]
    assert "payload.ddtree-unknown" in ids(
        diagnose(ct200(unknown), venv=unknown.path, deployment=dep, model_facts=None)
    )
    dflash = dep.model_copy(update={"algorithm": "dflash"})
    assert not any(i.startswith("payload.") for i in ids(diagnose(
        ct200(plain), venv=plain.path, deployment=dflash, model_facts=None)))  # fmt: skip


def test_a_declared_release_outside_the_payload_matrix(dep: Deployment) -> None:
    from ddtree_deploy.rules.matrix import shipped_matrix

    matrix = shipped_matrix()
    moved = dep.model_copy(update={"sglang": dep.sglang.model_copy(update={"version": "0.5.12"})})
    f = only(diagnose(ct200(venv_healthy()), venv="/root/venv_sglang211", deployment=moved,
                      model_facts=None), "payload.sglang-unsupported")
    assert "does not support sglang 0.5.12" in f.message and matrix.listing() in f.message
    assert f.evidence["patch"] == ["0.5.11"]
    assert "payload.sglang-unsupported" not in ids(diagnose(
        ct200(venv_healthy()), venv="/root/venv_sglang211", deployment=dep, model_facts=None))
    plain = moved.model_copy(update={"payload": False})
    assert "payload.sglang-unsupported" not in ids(diagnose(
        ct200(venv_healthy()), venv="/root/venv_sglang211", deployment=plain, model_facts=None))


def test_a_0517_venv_wants_the_plugin_not_the_patched_spec_info(dep: Deployment) -> None:
    from ddtree_deploy.facts.model import PayloadInfo

    moved = dep.model_copy(update={"sglang": dep.sglang.model_copy(update={"version": "0.5.17"})})
    venv = venv_healthy(ddtree=False)
    assert venv.sglang is not None
    venv.sglang.version = "0.5.17"
    venv.distributions["sglang"] = "0.5.17"
    found = ids(diagnose(ct200(venv), venv=venv.path, deployment=moved, model_facts=None))
    assert "payload.plugin-missing" in found and "payload.ddtree-missing" not in found
    venv.sglang.payload = PayloadInfo(payload="ddtree-sglang-plugin", version="0.3.0",
                                      intact=True, form="plugin", sglang="0.5.17")
    found = ids(diagnose(ct200(venv), venv=venv.path, deployment=moved, model_facts=None))
    assert not any(i.startswith("payload.") for i in found), found
    venv.sglang.payload.intact = False
    f = only(diagnose(ct200(venv), venv=venv.path, deployment=moved, model_facts=None),
             "payload.plugin-missing")
    assert "changed since it was installed" in f.message
    assert "payload deploy ct200 --venv /root/venv_sglang211" in f.remedy


def test_ddtree_attention_backend(dep: Deployment) -> None:
    fa3 = dep.model_copy(update={"attention_backend": "fa3"})
    f = only(diagnose(ct200(), venv=None, deployment=fa3, model_facts=None),
             "deploy.ddtree-attention")  # fmt: skip
    assert f.severity == "error" and "--attention-backend triton" in f.remedy
    assert f.evidence["backends"] == {"--attention-backend": "fa3"}
    assert "deploy.ddtree-attention" not in ids(diagnose(ct200(), venv=None, deployment=dep,
                                                         model_facts=None))  # fmt: skip
    # none named: the payload picks triton itself
    unnamed = dep.model_copy(update={"attention_backend": None})
    assert "deploy.ddtree-attention" not in ids(diagnose(ct200(), venv=None, deployment=unnamed,
                                                         model_facts=None))  # fmt: skip
    # named in extra_args counts as named
    extra = unnamed.model_copy(update={"extra_args": ["--decode-attention-backend=flashinfer"]})
    f = only(diagnose(ct200(), venv=None, deployment=extra, model_facts=None),
             "deploy.ddtree-attention")  # fmt: skip
    assert f.severity == "error" and "--decode-attention-backend flashinfer" in f.message
    assert dep.ddtree is not None
    shadow = fa3.model_copy(update={"ddtree": dep.ddtree.model_copy(
        update={"shadow_linear": True})})
    f = only(diagnose(ct200(), venv=None, deployment=shadow, model_facts=None),
             "deploy.ddtree-attention")  # fmt: skip
    assert f.severity == "info" and "linear chain" in f.message


# ---- model fit


def test_model_fit_configs_missing() -> None:
    mf = models(target_config=None, draft_config=None, errors={"target": "no config.json"})
    found = diagnose(ct200(), venv=None, deployment=None, model_facts=mf)
    assert ids(found) == ["model.draft-config-missing", "model.target-config-missing"]
    no_draft = ModelFacts(
        target_path="/m", target_config={"hidden_size": 8, "num_hidden_layers": 4}
    )
    assert diagnose(ct200(), venv=None, deployment=None, model_facts=no_draft) == []


def test_model_fit_mismatches() -> None:
    draft = {"hidden_size": 4096, "dflash_config": {"target_layer_ids": [1, 30, 64]}}
    found = diagnose(ct200(), venv=None, deployment=None, model_facts=models(draft_config=draft))
    assert ids(found) == ["model.hidden-size-mismatch", "model.target-layers-out-of-range"]
    assert only(found, "model.target-layers-out-of-range").evidence["out_of_range"] == [64]


def test_expected_width_without_layer_ids_uses_draft_layers() -> None:
    target = {"hidden_size": 5120, "num_hidden_layers": 64}
    assert expected_width(target, {"hidden_size": 5120, "num_hidden_layers": 5}) == 25_600
    assert expected_width(target, {"hidden_size": 5120}) is None


# ---- floors


def test_floors_carry_their_sources() -> None:
    sources = all_sources()
    assert all(text.strip() for text in sources.values())
    pins = SGLANG_PINS["0.5.11"].as_requirements()
    assert pins == {"torch": "2.11.0", "sglang-kernel": "0.4.2",
                    "flashinfer-python": "0.6.8.post1", "xgrammar": "0.1.32",
                    "soundfile": "0.13.1"}  # fmt: skip
