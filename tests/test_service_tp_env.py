"""Tensor-parallel deployments, `environment:`, `sampling_backend` and the verify width (issues 12
and 17, the CPU parts): from hosts.yaml through the facts to the unit systemd reads.

Facts: tests/facts/layouts/ct200.json (CT200's 8 GPUs, GPU0 held by qwen-wrapper.service; see
SOURCES.txt there), changed per test where a GPU dies or is taken.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.config.hosts import ConfigError, Deployment, load_config
from ddtree_deploy.converge.hoststate import HostState
from ddtree_deploy.converge.planner import plan_host
from ddtree_deploy.errors import RefusedError
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.service.render import UnitRenderError, render_unit
from ddtree_deploy.service.resolve import build_spec, choose_gpus, settings_for
from ddtree_deploy.service.verify import verify_unit
from ddtree_deploy.settings.layers import flag_layer
from ddtree_deploy.transport.local import LocalTransport

LAYOUT = Path(__file__).parent / "facts" / "layouts" / "ct200.json"
OWN = "sglang-ddtree.service"


def ct200(dead: tuple[int, ...] = (), busy: tuple[int, ...] = ()) -> Facts:
    data: dict[str, Any] = json.loads(LAYOUT.read_text())
    for gpu in data["nvidia"]["gpus"]:
        if gpu["index"] in dead:
            gpu.update(dead=True, error="Unable to determine the device handle: Unknown Error")
        if gpu["index"] in busy:
            gpu["processes"] = [{"pid": 900 + gpu["index"], "name": "python3", "used_mib": 4000}]
    return Facts.model_validate(data)


def story() -> tuple[Any, Deployment]:
    config = load_config(embedded_hosts_file())
    return config, config.deployment("sglang-ddtree")


def deployment(**changes: Any) -> Deployment:
    _, dep = story()
    return dep.model_copy(update=changes)


# -- GPU choice for tp 2/4/8 on CT200's layout -----------------------------------------------


def test_tp8_on_ct200_is_refused_with_the_reason() -> None:
    with pytest.raises(RefusedError) as err:
        choose_gpus(ct200(), None, 8, own_unit=OWN)
    text = err.value.message
    assert text == ("tp 8 needs 8 free contiguous GPUs; on ct200: GPU 0 is busy (held by PID 412 "
                    "(port 30000) of qwen-wrapper.service); the longest run of free contiguous "
                    "GPUs is 1-7")
    assert err.value.hint == "a tp_size of at most 7 fits (GPUs 1-7); or free the GPUs above"
    with pytest.raises(RefusedError, match=r"needs GPUs 0-7 on ct200: GPU 0 is busy .*PID 412"):
        choose_gpus(ct200(), 0, 8, own_unit=OWN)
    assert choose_gpus(ct200(), 0, 8, own_unit=OWN, force=True) == tuple(range(8))


def test_tp4_and_tp2_pick_free_contiguous_gpus() -> None:
    assert choose_gpus(ct200(), None, 4, own_unit=OWN) == (4, 5, 6, 7)  # aligned: 0-3 is busy
    assert choose_gpus(ct200(), None, 2, own_unit=OWN) == (2, 3)
    assert choose_gpus(ct200(), 1, 4, own_unit=OWN) == (1, 2, 3, 4)  # named: taken as given
    # a dead GPU5 breaks 4-7: the only run of four left is 1-4
    assert choose_gpus(ct200(dead=(5,)), None, 4, own_unit=OWN) == (1, 2, 3, 4)


def test_tp4_says_why_it_cannot_when_contiguity_is_broken() -> None:
    facts = ct200(dead=(3,), busy=(6,))
    with pytest.raises(RefusedError) as err:
        choose_gpus(facts, None, 4, own_unit=OWN)
    text = err.value.message
    assert "tp 4 needs 4 free contiguous GPUs; on ct200: GPU 0 is busy" in text
    assert "GPU 3 is dead (Unable to determine the device handle: Unknown Error)" in text
    assert "GPU 6 is busy (held by PID 906)" in text
    assert text.endswith("the longest run of free contiguous GPUs is 1-2")
    with pytest.raises(RefusedError, match="needs GPUs 2-5 on ct200: GPU 3 is dead"):
        choose_gpus(facts, 2, 4, own_unit=OWN)
    with pytest.raises(RefusedError, match="has no GPU 8, 9"):
        choose_gpus(facts, 6, 4, own_unit=OWN)


def test_own_running_service_does_not_block_its_gpus() -> None:
    data = json.loads(LAYOUT.read_text())
    for i in (4, 5, 6, 7):
        data["nvidia"]["gpus"][i]["processes"] = [{"pid": 77, "unit": OWN}]
    facts = Facts.model_validate(data)
    assert choose_gpus(facts, None, 4, own_unit=OWN) == (4, 5, 6, 7)
    with pytest.raises(RefusedError, match="longest run of free contiguous GPUs is 1-3"):
        choose_gpus(facts, None, 4, own_unit="other.service")


@pytest.mark.parametrize(("tp", "gpus"), [(2, "2,3"), (4, "4,5,6,7")])
def test_unit_and_plan_of_a_tp_deployment(tp: int, gpus: str) -> None:
    config, dep = story()
    host = config.host("ct200")
    tp_dep = dep.model_copy(update={"tp_size": tp, "gpu": None})
    spec = build_spec(config, host, ct200(), tp_dep)
    unit = render_unit(spec, tool_version="0.1.0")
    assert f"Environment=CUDA_VISIBLE_DEVICES={gpus}" in unit.splitlines()
    assert f"    --tp-size {tp} \\" in unit.splitlines()
    config.deployments["sglang-ddtree"] = tp_dep
    steps = plan_host(config, host, ct200(), HostState())
    assert [s.kind for s in steps if s.kind.startswith(("unit.", "service."))] == [
        "unit.install", "service.start", "service.probe"]
    tp8 = dep.model_copy(update={"tp_size": 8, "gpu": None})
    config.deployments["sglang-ddtree"] = tp8
    with pytest.raises(RefusedError, match="tp 8 needs 8 free contiguous GPUs"):
        plan_host(config, host, ct200(), HostState())


# -- environment: and sampling_backend ---------------------------------------------------------

ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^lo docker0", "NCCL_DEBUG_FILE": "/tmp/n.%h",
       "CUDA_MODULE_LOADING": "LAZY", "A_DOLLAR": "$HOME"}


def test_environment_and_sampling_backend_in_the_unit() -> None:
    config, _ = story()
    spec = build_spec(config, config.host("ct200"), ct200(),
                      deployment(environment=ENV, sampling_backend="pytorch"))
    lines = render_unit(spec, tool_version="0.1.0").splitlines()
    env = [ln for ln in lines if ln.startswith("Environment=")]
    assert env == [
        "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "Environment=CUDA_VISIBLE_DEVICES=1",
        env[2],  # LD_LIBRARY_PATH of the venv
        "Environment=PYTHONUNBUFFERED=1",
        'Environment="A_DOLLAR=$HOME"',  # $ means nothing in Environment=: kept as it is
        "Environment=CUDA_MODULE_LOADING=LAZY",
        "Environment=NCCL_DEBUG_FILE=/tmp/n.%%h",  # % would be a specifier
        "Environment=NCCL_P2P_DISABLE=1",
        'Environment="NCCL_SOCKET_IFNAME=^lo docker0"',
    ]
    assert env[2].startswith("Environment=LD_LIBRARY_PATH=")
    assert "    --sampling-backend pytorch \\" in lines


def test_the_tool_own_variables_are_refused_at_render_too() -> None:
    config, _ = story()
    spec = build_spec(config, config.host("ct200"), ct200(), deployment())
    from dataclasses import replace

    smuggled = spec.settings.model_copy(update={"environment": {"CUDA_VISIBLE_DEVICES": "0"}})
    with pytest.raises(UnitRenderError, match=r"CUDA_VISIBLE_DEVICES is set by the tool itself "
                       r"\(from the deployment's gpu and tp_size\)"):
        render_unit(replace(spec, settings=smuggled), tool_version="0.1.0")


HOSTS_TAIL = """
    environment:
      NCCL_P2P_DISABLE: "1"
      nccl_lower: "x"
      9LIVES: "x"
      LD_LIBRARY_PATH: "/opt/lib"
      NCCL_IB_HCA: 1
      NCCL_NL: "a\\nb"
      NCCL_NUL: "a\\0b"
      HF_TOKEN: "x"
    sampling_backend: triton
"""


def test_environment_and_sampling_backend_are_validated_when_loaded(tmp_path: Path) -> None:
    text = embedded_hosts_file().read_text() + HOSTS_TAIL
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    lines = text.splitlines()

    def line_of(key: str) -> int:
        return next(i for i, ln in enumerate(lines, 1) if ln.strip().startswith(key))

    for key, needle in (
        ("nccl_lower", "expected a variable name of capitals, digits and '_'"),
        ("9LIVES", "expected a variable name of capitals"),
        ("LD_LIBRARY_PATH", "LD_LIBRARY_PATH is set by ddtree-deploy itself from the venv's "
                            "own nvidia library folders"),
        ("NCCL_IB_HCA", "expected a value in quotes (YAML reads this as a number)"),
        ("NCCL_NL", "expected a value without control characters or line separators: it "
                    "contains '\\n' (U+000A"),
        ("NCCL_NUL", "contains a NUL character"),  # the YAML loader's own check
        ("HF_TOKEN", "looks like a secret"),
        ("sampling_backend", "expected 'flashinfer', 'pytorch' or 'ascend', got 'triton'"),
    ):
        where = f"{path}:{line_of(key)}: deployments.sglang-ddtree."
        assert any(ln.startswith(where) and needle in ln for ln in msg.splitlines()), (key, msg)
    assert "environment.NCCL_P2P_DISABLE" not in msg  # the good one is not reported
    assert msg.count(f"{path}:") == 8  # one each (a NUL is reported by the loader alone)


needs_analyzer = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                    reason="systemd-analyze is not installed here")


@needs_analyzer
def test_systemd_accepts_a_tp4_unit_with_environment(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "venv 50%"
    (venv / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", venv / "bin" / "python")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    config, _ = story()
    spec = build_spec(config, config.host("ct200"), ct200(),
                      deployment(tp_size=4, gpu=None, environment=ENV, sampling_backend="pytorch"),
                      venv=str(venv), require_venv=False)
    assert spec.gpus == (4, 5, 6, 7)
    verify_unit(LocalTransport(), render_unit(spec, tool_version="0.1.0"), spec.unit_name)


# -- the verify width: budget + 1 against the drafter's block size ------------------------------


def b8_drafter(facts: Facts, block: dict[str, Any]) -> Facts:
    """The real H200 rehearsal's drafter (tests/facts/real/... README: block_size 8)."""
    draft = next(m for m in facts.models if m.path.endswith("DFlash-b16"))
    assert draft.config is not None
    draft.config = {**{k: v for k, v in draft.config.items() if k != "block_size"}, **block}
    return facts


def test_block_size_from_the_drafter_config_is_rendered() -> None:
    config, _ = story()
    host = config.host("ct200")
    spec = build_spec(config, host, ct200(), deployment())
    assert spec.num_draft_tokens == 16
    facts = b8_drafter(ct200(), {"dflash_config": {"block_size": 8, "mask_token_id": 1000}})
    spec = build_spec(config, host, facts, deployment())
    assert spec.num_draft_tokens == 8  # budget 15 + 1 >= 8: fine


@pytest.mark.parametrize("block", [{"block_size": 32}, {"dflash_config": {"block_size": 32}}])
def test_a_budget_below_the_block_is_refused_by_plan_and_service(block: dict[str, Any]) -> None:
    config, dep = story()
    host = config.host("ct200")
    facts = b8_drafter(ct200(), block)
    with pytest.raises(RefusedError) as err:
        build_spec(config, host, facts, dep)
    # said at the line of hosts.yaml that set the budget
    line = config.line_of(("deployments", "sglang-ddtree", "ddtree", "budget"))
    assert err.value.message.startswith(
        f"{config.path}:{line}: deployments.sglang-ddtree.ddtree.budget: DDTREE budget 15 gives "
        "a verify width of 16 tokens per request per round (root + budget nodes), below the "
        "drafter's block size 32")
    assert "DFLASH draft OOM" in str(err.value)
    assert err.value.hint is not None
    assert "deployments.sglang-ddtree.ddtree.budget in hosts.yaml to at least 31" in err.value.hint
    assert "--speculative-ddtree-budget" in err.value.hint
    with pytest.raises(RefusedError, match="verify width of 16"):
        plan_host(config, host, facts, HostState())
    assert dep.ddtree is not None
    shadow = dep.model_copy(update={"ddtree": dep.ddtree.model_copy(
        update={"shadow_linear": True})})
    assert build_spec(config, host, facts, shadow).num_draft_tokens == 32
    wider = settings_for(config, host, dep, flag_layer({("ddtree", "budget"): 31}))
    tree = build_spec(config, host, facts, dep, wider).settings.ddtree
    assert tree is not None and tree.budget == 31
    with pytest.raises(RefusedError) as err:  # a flag's budget: said at the flag
        build_spec(config, host, facts, dep,
                   settings_for(config, host, dep, flag_layer({("ddtree", "budget"): 30})))
    assert err.value.message.startswith("--ddtree-budget: DDTREE budget 30 gives")


def test_doctor_flags_the_verify_width_with_its_memory_effect() -> None:
    from ddtree_deploy.rules import diagnose
    from ddtree_deploy.rules.model_fit import model_facts_from

    _, dep = story()
    facts = b8_drafter(ct200(), {"block_size": 32})
    wide = dep.model_copy(update={"extra_args": ["--max-running-requests", "48",
                                                 "--cuda-graph-max-bs=32"]})
    mf = model_facts_from(facts, str(dep.model_path), str(dep.draft_model_path))
    (f,) = [f for f in diagnose(facts, deployment=wide, model_facts=mf)
            if f.id == "deploy.ddtree-verify-width"]
    assert f.severity == "error"
    assert f.evidence == {
        "budget": 15, "verify_width": 16, "block_size": 32,
        "block_size_from": "/dev/shm/Qwen3.6-27B-DFlash-b16/config.json block_size",
        "kv_slots_per_request_per_round": 16, "kv_slots_per_round": 768,
        "draft_writes_per_round": 1536, "cuda_graph_tokens_at_max_bs": 512,
    }
    assert "CUDA graphs" in f.message and "KV slots" in f.message
    assert "ddtree.budget in hosts.yaml to at least 31" in f.remedy
    fine = diagnose(ct200(), deployment=dep, model_facts=model_facts_from(
        ct200(), str(dep.model_path), str(dep.draft_model_path)))
    assert "deploy.ddtree-verify-width" not in [x.id for x in fine]


def test_doctor_says_where_a_tp_deployment_runs_or_why_it_cannot() -> None:
    from ddtree_deploy.rules import diagnose

    def tp_finding(facts: Facts, tp: int) -> Any:
        found = [f for f in diagnose(facts, deployment=deployment(tp_size=tp, gpu=None))
                 if f.id == "deploy.tp-gpus"]
        assert len(found) == 1
        return found[0]

    f = tp_finding(ct200(), 4)
    assert f.severity == "info" and f.evidence["gpus"] == [4, 5, 6, 7]
    f = tp_finding(ct200(), 8)
    assert f.severity == "error" and f.message.startswith("tp 8 needs 8 free contiguous GPUs")
    assert "GPU 0 is busy" in f.message and "at most 7" in f.remedy and "tp_size" in f.remedy
    assert f.evidence == {"tp_size": 8, "free_gpus": [1, 2, 3, 4, 5, 6, 7]}
    assert not [x for x in diagnose(ct200(), deployment=deployment()) if x.id == "deploy.tp-gpus"]


def test_doctor_suggests_the_first_gpu_of_a_free_run_for_a_busy_tp_deployment() -> None:
    from ddtree_deploy.rules import diagnose

    found = diagnose(ct200(), deployment=deployment(tp_size=4, gpu=0))
    busy = [f for f in found if f.id == "deploy.gpu-busy"]
    assert len(busy) == 1 and busy[0].evidence["gpu"] == 0
    assert "service up ct200 sglang-ddtree --gpu 4`" in busy[0].remedy
