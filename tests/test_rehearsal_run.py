"""The GPU rehearsal's CPU-side parts: fault injection, the result schema, hosts files, checks.

The rehearsal itself needs a GPU (benchmarks/RESULTS.md has its runs); these tests pin what can
be checked here: the negative controls' faults really change the payload's behaviour, the
per-server hosts file is one the tool accepts, and the checks judge answers as intended.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rehearsal import checks, result  # noqa: E402
from rehearsal.designs import expected, get_design  # noqa: E402
from rehearsal.servers import Server, hosts_file  # noqa: E402

_PROBE = r"""
import sys, types, torch
m = types.ModuleType("sglang"); m.__path__ = [sys.argv[1]]; sys.modules["sglang"] = m
from sglang.srt.speculative import ddtree_verify, ddtree_sampling
mask = torch.eye(3, dtype=torch.bool).unsqueeze(0)
flat = ddtree_verify.tree_custom_mask(mask, torch.tensor([0]), 9)
logits = torch.tensor([[0.0, 3.0, 0.0]] * 400)
ones = torch.ones(400)
s = ddtree_sampling.sample_tokens(logits, ones * 4.0, torch.full((400,), 3), ones,
                                  generator=torch.Generator().manual_seed(0))
print(int(flat.sum()), float((s == 1).float().mean()))
"""


def _package(tmp: Path) -> Path:
    pkg = tmp / "sglang"
    spec = pkg / "srt" / "speculative"
    spec.mkdir(parents=True)
    for part in (pkg, pkg / "srt", spec):
        (part / "__init__.py").write_text("")
    payload = ROOT / "payload"
    shutil.copy(payload / "ddtree" / "core.py", spec / "ddtree_core.py")
    shutil.copy(payload / "ddtree" / "sampling.py", spec / "ddtree_sampling.py")
    shutil.copy(payload / "sglang-0.5.11" / "srt" / "speculative" / "ddtree_verify.py",
                spec / "ddtree_verify.py")
    return pkg


def _run(pkg: Path, fault: str | None) -> tuple[int, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if fault:
        env["REHEARSAL_FAULT"] = fault
        env["PYTHONPATH"] = str(ROOT / "rehearsal" / "faults")
    done = subprocess.run([sys.executable, "-c", _PROBE, str(pkg)], capture_output=True,
                          text=True, env=env, check=True, timeout=120)
    allowed, share = done.stdout.split()
    if fault:
        assert f"REHEARSAL FAULT ACTIVE: {fault}" in done.stderr
    return int(allowed), float(share)


def test_faults_change_what_they_claim_and_nothing_without_them(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    clean_allowed, clean_share = _run(pkg, None)
    assert clean_allowed == 3  # three slots that each see only themselves
    assert 0.4 < clean_share < 0.75  # token 1 at temperature 4: e^0.75 / (e^0.75 + 2) = 0.51
    mask_allowed, _ = _run(pkg, "mask")
    assert mask_allowed == 5  # slot i also sees slot i + 1
    _, greedy_share = _run(pkg, "greedy-follow")
    assert greedy_share == 1.0
    _, hot_share = _run(pkg, "hot")
    assert hot_share > 0.8  # temperature 1: e^3 / (e^3 + 2) = 0.91
    pinned_allowed, pinned_share = _run(pkg, "mask-pinned")  # a variant, not a fault
    assert (pinned_allowed, pinned_share) == (clean_allowed, clean_share)


def test_a_servers_hosts_file_is_one_the_tool_accepts(tmp_path: Path) -> None:
    from ddtree_deploy.config.hosts import load_config

    server = Server("ddtree15-x", "/m/ladder", "ddtree", 15, 8, port=31002, fault="mask",
                    extra=("--speculative-num-draft-tokens", "8"))
    path = hosts_file(server, "/opt/torch/.venv", tmp_path)
    config = load_config(path)
    dep = config.deployment("ddtree15-x")
    assert dep.host == "localhost" and dep.algorithm == "ddtree" and dep.port == 31002
    assert dep.ddtree is not None and (dep.ddtree.budget, dep.ddtree.topk) == (15, 8)
    assert dep.environment["HF_HUB_OFFLINE"] == "1"
    assert dep.extra_args[-2:] == ["--speculative-num-draft-tokens", "8"]
    nobackend = Server("d", "/m", "ddtree", 15, 8, backend=None, port=31003)
    assert load_config(hosts_file(nobackend, "/v", tmp_path)).deployment("d").attention_backend \
        is None


def test_the_lossless_check_judges_against_the_closed_form(monkeypatch: pytest.MonkeyPatch) -> None:
    design = get_design("ladder")
    prompts = checks.prompt_set(design, 6, seed=1)

    def fake_batch(port, ps, ns, **kw):  # type: ignore[no-untyped-def]
        out = []
        for i, (p, n) in enumerate(zip(ps, ns, strict=True)):
            ids = expected(design, p, n)
            if port == 2 and i == 1:
                ids = ids[:3] + [999] + ids[4:]
            out.append(checks.client.Answer(output_ids=ids, meta={}))
        return out

    monkeypatch.setattr(checks.client, "batch", fake_batch)
    good = checks.lossless(1, design, prompts, concurrency=6)
    bad = checks.lossless(2, design, prompts, concurrency=6)
    assert good["ok"] and good["wrong"] == 0
    assert not bad["ok"] and bad["wrong"] == 1 and bad["wrong_first"][0]["first_diff"] == 3


def test_max_running_reads_the_decode_lines(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text("[x] Decode batch, #running-req: 7, #token: 1\n"
                   "[x] Decode batch, #running-req: 32, #token: 9\nother #running-req: 99\n")
    assert checks.max_running(log) == 32
    assert checks.max_running(tmp_path / "missing.log") == -1


def test_result_schema_accepts_a_partial_run_and_refuses_unknown_sections() -> None:
    doc = {"format": 1, "phase": "correctness", "steps": {"install": {"ok": True, "seconds": 3}},
           "servers": {}, "checks": {"lossless/a": {"ok": True, "requests": 40, "failed": 0,
                                                     "wrong": 0, "max_running_req": 32}},
           "perf": {}, "not_run": [{"step": "servers", "why": "90 s left"}], "errors": []}
    got = result.Result.model_validate(doc)
    assert got.lossless()["a"].max_running_req == 32
    with pytest.raises(ValueError):
        result.Result.model_validate({**doc, "surprise": 1})
    with pytest.raises(ValueError):
        result.Result.model_validate({**doc, "servers": {"s": {"port": 0, "argv": [],
                                                                "probe_exit": 0, "probe": {}}}})
    assert json.loads(got.model_dump_json())["phase"] == "correctness"


def test_the_real_h200_runs_validate_and_say_what_they_found() -> None:
    """Run 2 of the rehearsal on the H200 (2026-12-01, correctness phase), copied from the
    device's output (benchmarks/results/rehearsal/h200-run2.json holds the same file)."""
    got = result.load(str(ROOT / "tests" / "data" / "rehearsal" / "h200-run2.json"))
    lossless = got.lossless()
    assert lossless["ddtree15-ladder"].ok and lossless["ddtree15-ladder"].max_running_req == 31
    assert not lossless["ddtree15-alarm-maskfault"].ok  # the negative control failed, as meant
    assert got.checks["sampling/ddtree15-ladder"]["ok"]
    assert not got.checks["sampling/ddtree15-ladder-greedyfollow"]["ok"]


def test_a_budget_too_small_to_start_servers_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rehearsal import run

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        run.main(["--carry", str(tmp_path), "--out", str(out), "--phase", "perf",
                  "--budget", "265"])
    assert info.value.code == 2
    assert f"needs at least {run.MIN_SERVER_BUDGET} s" in capsys.readouterr().err
    assert not out.exists()  # refused before the output folder or the scratch folder is touched
