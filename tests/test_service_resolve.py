"""GPU and port choice from facts, and the ServiceSpec a deployment resolves to (pure)."""

from __future__ import annotations

import pytest

from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.errors import RefusedError
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.service.resolve import build_spec, choose_gpu, choose_port, settings_for
from ddtree_deploy.settings.layers import flag_layer

VENV = "/root/venv_sglang211"
SP = f"{VENV}/lib/python3.11/site-packages"


def ct200_facts(own_on_gpu1: bool = False) -> Facts:
    gpus = [{"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
             "compute_cap": "12.0", "memory_total_mib": 97887, "processes": []} for i in range(8)]
    gpus[0]["processes"] = [{"pid": 30, "ports": [30000], "unit": "qwen-wrapper.service"}]
    listeners = [{"port": 30000, "address": "0.0.0.0", "pid": 30, "unit": "qwen-wrapper.service"},
                 {"port": 22, "address": "0.0.0.0", "pid": 12, "unit": "ssh.service"}]
    if own_on_gpu1:
        gpus[1]["processes"] = [{"pid": 77, "ports": [30001], "unit": "sglang-ddtree.service"}]
        listeners.append({"port": 30001, "address": "0.0.0.0", "pid": 77,
                          "unit": "sglang-ddtree.service"})
    return Facts.model_validate({
        "host": "ct200",
        "nvidia": {"present": True, "gpus": gpus},
        "services": {"listeners": listeners},
        "venvs": [{"path": VENV, "nvidia": {"cu13": True, "other": ["nccl", "cudnn"], "lib_dirs": [
            f"{SP}/nvidia/nccl/lib", f"{SP}/nvidia/cu13/lib", f"{SP}/nvidia/cudnn/lib"]}}],
    })


def ct129_facts() -> Facts:
    return Facts.model_validate({"host": "ct129", "nvidia": {"present": True, "gpus": [
        {"index": 0, "processes": []},
        {"index": 1, "dead": True, "error": "temperature: Unknown Error"},
    ]}})


def test_busy_gpu_is_refused_naming_pid_port_and_unit() -> None:
    with pytest.raises(RefusedError) as info:
        choose_gpu(ct200_facts(), 0, own_unit="sglang-ddtree.service")
    text = str(info.value)
    assert "PID 30" in text and "30000" in text and "qwen-wrapper.service" in text
    assert choose_gpu(ct200_facts(), 0, own_unit="x.service", force=True) == 0


def test_dead_gpu_is_refused_and_never_chosen() -> None:
    with pytest.raises(RefusedError, match="dead"):
        choose_gpu(ct129_facts(), 1, own_unit="x.service")
    assert choose_gpu(ct129_facts(), None, own_unit="x.service") == 0
    assert choose_gpu(ct129_facts(), 1, own_unit="x.service", force=True) == 1


def test_missing_gpu_index_is_refused() -> None:
    with pytest.raises(RefusedError, match="has no GPU 9"):
        choose_gpu(ct129_facts(), 9, own_unit="x.service")


def test_automatic_choice_skips_busy_and_the_own_unit_does_not_count() -> None:
    assert choose_gpu(ct200_facts(), None, own_unit="x.service") == 1
    assert choose_gpu(ct200_facts(own_on_gpu1=True), 1, own_unit="sglang-ddtree.service") == 1
    with pytest.raises(RefusedError):
        choose_gpu(ct200_facts(own_on_gpu1=True), 1, own_unit="other.service")


def test_ports() -> None:
    with pytest.raises(RefusedError, match="port 30000 .* taken by PID 30 of qwen-wrapper"):
        choose_port(ct200_facts(), 30000, own_unit="x.service")
    assert choose_port(ct200_facts(), None, own_unit="x.service") == 30001
    assert choose_port(ct200_facts(own_on_gpu1=True), 30001,
                       own_unit="sglang-ddtree.service") == 30001


def test_the_story_deployment_resolves_to_its_spec() -> None:
    config = load_config(embedded_hosts_file())
    host, dep = config.host("ct200"), config.deployment("sglang-ddtree")
    spec = build_spec(config, host, ct200_facts(), dep)
    assert (spec.gpus, spec.port, spec.venv) == ((1,), 30001, VENV)
    assert spec.ld_library_path[0].endswith("nvidia/cu13/lib")
    args = spec.server_args()
    for flag, value in (("--speculative-algorithm", "DDTREE"), ("--port", "30001"),
                        ("--speculative-ddtree-budget", "15"), ("--speculative-ddtree-topk", "8"),
                        ("--attention-backend", "triton"), ("--grammar-backend", "none"),
                        ("--model-path", "/dev/shm/Qwen3.6-27B")):
        assert args[args.index(flag) + 1] == value
    flags = flag_layer({("gpu",): 2, ("port",): 30005, ("algorithm",): "dflash",
                        ("attention_backend",): "flashinfer"})
    flagged = build_spec(config, host, ct200_facts(), dep, settings_for(config, host, dep, flags))
    assert flagged.gpus == (2,) and flagged.port == 30005
    assert flagged.settings.attention_backend == "flashinfer"


def test_a_venv_missing_on_the_host_is_refused() -> None:
    config = load_config(embedded_hosts_file())
    with pytest.raises(RefusedError, match="does not exist"):
        build_spec(config, config.host("ct200"), ct200_facts(),
                   config.deployment("sglang-ddtree"), venv="/root/nowhere")
