"""Phase perf-8b's CPU-side parts (rehearsal/perf8b.py, rehearsal/snapshot.py): the 8B-shaped
configs, the servers as the tool renders them, the per-round profile summary and its sync limit,
the earlier payload's snapshot and venv, and SIGSTOP of the servers not being timed."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rehearsal import perf8b, phases, profile, run, snapshot  # noqa: E402
from rehearsal.servers import hosts_file  # noqa: E402


def test_the_pair_has_qwen3_8b_shape_and_the_drafters_block(tmp_path: Path) -> None:
    perf8b.write_models(tmp_path)
    target = json.loads((tmp_path / "target" / "config.json").read_text())
    draft = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert (target["hidden_size"], target["num_hidden_layers"], target["num_attention_heads"],
            target["num_key_value_heads"], target["head_dim"], target["vocab_size"]) == \
        (4096, 36, 32, 8, 128, 151936)
    assert draft["num_hidden_layers"] == 5 and draft["dflash_config"]["block_size"] == 16
    assert draft["dflash_config"]["target_layer_ids"] == [1, 9, 17, 25, 33]
    assert max(draft["dflash_config"]["target_layer_ids"]) < target["num_hidden_layers"]
    assert draft["dflash_config"]["mask_token_id"] < target["vocab_size"]


def test_servers_are_judged_settings_and_the_old_one_only_with_a_snapshot(tmp_path: Path) -> None:
    plain = perf8b.servers("/m", old_venv=None)
    ab = perf8b.servers("/m", old_venv="/w/venv-old")
    assert [s.name for s in plain] == ["nospec-8b", "dflash-8b", "ddtree15-8b", "ddtree31-8b",
                                       "ddtree15-8b-extendattn"]
    assert dict(plain[-1].env)["SGLANG_DDTREE_TREE_ATTENTION"] == "0"
    # the patch set (0.5.11) takes no plugin switch: its tree kernel is on by default
    assert [dict(s.env).get("SGLANG_DDTREE_TREE_ATTENTION") for s in plain] == [None] * 4 + ["0"]
    assert not any("SGLANG_DDTREE_VERIFY_GRAPH" in dict(s.env) for s in plain)
    assert [s.name for s in ab][-1] == "ddtree15-8b-old" and ab[-1].venv == "/w/venv-old"
    for s in ab:
        dep = s.deployment("torch")
        assert dep["attention_backend"] == "triton" and dep["sampling_backend"] == "pytorch"
        assert dep["cuda_graph"] is True and dep["extra_args"][:2] == ["--load-format", "dummy"]
        assert dep["environment"]["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "1"
    doc = hosts_file(ab[-1], ab[-1].venv or "", tmp_path)
    assert "/w/venv-old" in doc.read_text()


def test_on_the_plugin_form_the_ab_is_the_plugins_own_switches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a snapshot of the patch set carried by mistake is not deployed into a 0.5.17 venv
    monkeypatch.setattr(perf8b, "snapshot_dir", lambda repo: tmp_path)
    assert run._old_payload("0.5.17") is None and run._old_payload("0.5.11") == tmp_path
    got = {s.name: s for s in run._servers("perf-8b", sglang="0.5.17")}
    assert "ddtree15-8b-old" not in got and all(s.venv is None for s in got.values())
    # each server names both switches (the plugin's default, both on from 0.3.4, is named too:
    # the A/B does not depend on the plugin release's default)
    switches = {name: {k: v for k, v in s.env if k in (
        "SGLANG_DDTREE_TREE_ATTENTION", "SGLANG_DDTREE_VERIFY_GRAPH")}
        for name, s in got.items() if s.algorithm == "ddtree"}
    assert switches == {
        "ddtree15-8b": {"SGLANG_DDTREE_TREE_ATTENTION": "1", "SGLANG_DDTREE_VERIFY_GRAPH": "1"},
        "ddtree31-8b": {"SGLANG_DDTREE_TREE_ATTENTION": "1", "SGLANG_DDTREE_VERIFY_GRAPH": "1"},
        "ddtree15-8b-prev": {"SGLANG_DDTREE_TREE_ATTENTION": "0",
                             "SGLANG_DDTREE_VERIFY_GRAPH": "0"},
        "ddtree15-8b-eagerverify": {"SGLANG_DDTREE_TREE_ATTENTION": "1",
                                    "SGLANG_DDTREE_VERIFY_GRAPH": "0"},
        "ddtree15-8b-extendattn": {"SGLANG_DDTREE_TREE_ATTENTION": "0",
                                   "SGLANG_DDTREE_VERIFY_GRAPH": "1"}}
    # ... and every switch reaches the unit the tool renders
    dep = replace(got["ddtree15-8b"], sglang="0.5.17").deployment("torch")
    assert dep["environment"]["SGLANG_DDTREE_TREE_ATTENTION"] == "1"
    assert dep["environment"]["SGLANG_DDTREE_VERIFY_GRAPH"] == "1"
    for name in ("ddtree15-8b-prev", "ddtree15-8b-eagerverify"):
        dep = replace(got[name], sglang="0.5.17").deployment("torch")
        assert dep["sglang"] == {"version": "0.5.17"} and dep["ddtree"]["budget"] == 15
        assert dep["environment"]["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "1"
    # session 7's final device call (0.5.17: perf-8b, request-params, the alarm design), as
    # run.py checks it
    only = ("rp-nospec,rp-ddtree15,rp-ddtree31-nograph,rp-ddtree15-topkfault,"
            "rp-ddtree15-penaltyfault,ddtree15-alarm,nospec-8b,dflash-8b,ddtree15-8b,ddtree31-8b,"
            "ddtree15-8b-prev")
    ns = argparse.Namespace(phase="correctness,request-params,perf-8b", budget=455, warm=0,
                            only=only, rounds=3, bench_runs="ladder,dummy", no_prewarm=False,
                            sglang="0.5.17")
    assert run.check_args(ns) is None
    assert "no such server" in str(run.check_args(argparse.Namespace(
        **{**vars(ns), "only": "ddtree15-8b-prev", "sglang": "0.5.11"})))


def test_the_phase_joins_a_comma_list_with_its_own_servers(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    named = phases.parse("perf-8b,perf")
    assert named == ("perf", "perf-8b")
    shared = phases.union(named, run._servers)
    assert not isinstance(shared, str)
    names = [s.name for s in shared]
    assert "ddtree15-8b" in names and "nospec-dummy" in names and len(set(names)) == len(names)
    # no snapshot carried in the checkout: no A/B server
    monkeypatch.setattr(perf8b, "snapshot_dir", lambda repo: None)
    assert "ddtree15-8b-old" not in [s.name for s in run._servers("perf-8b")]
    monkeypatch.setattr(perf8b, "snapshot_dir", lambda repo: tmp_path)
    old = [s for s in run._servers("perf-8b") if s.name == "ddtree15-8b-old"]
    assert old and old[0].venv == str(run.WORK / "venv-old")


def _x(cat: str, name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def _steps(syncs_each: int, steps: int = 4) -> list[dict[str, Any]]:
    """``steps`` rounds of 1000 us: GPU busy 600 us, 3 launches, a graph launch, ``syncs_each``
    waits of 50 us (a pageable copy's stream sync) and one enqueue-only copy."""
    out = []
    for i in range(steps):
        t = i * 1000.0
        out += [_x("cpu_op", "step", t, 1000), _x("kernel", "k", t + 100, 600)]
        out += [_x("cuda_runtime", "cudaLaunchKernel", t + 10 + j, 1) for j in range(2)]
        out += [_x("cuda_driver", "cuLaunchKernel", t + 20, 1),
                _x("cuda_runtime", "cudaGraphLaunch", t + 30, 5),
                _x("cuda_runtime", "cudaMemcpyAsync", t + 40, 2)]
        out += [_x("cuda_runtime", "cudaStreamSynchronize", t + 800 + 60 * j, 50)
                for j in range(syncs_each)]
    return out


def test_round_profile_counts_per_round() -> None:
    summary = profile.summarize(_steps(syncs_each=3), steps=4)
    per = perf8b.round_profile(summary)
    assert per["launches_per_round"] == 3 and per["graph_launches_per_round"] == 1
    assert per["syncs_per_round"] == 3 and per["copies_per_round"] == 1
    assert per["gpu_busy_ms"] == pytest.approx(0.6, abs=1e-3)
    assert per["host_blocked_ms"] == pytest.approx(0.15, abs=1e-3)


@pytest.mark.parametrize(("syncs", "ok"), [(1, True), (perf8b.SYNC_LIMIT, True),
                                          (perf8b.SYNC_LIMIT + 1, False)])
def test_the_sync_limit_fails_a_round_above_it(syncs: int, ok: bool) -> None:
    per = perf8b.round_profile(profile.summarize(_steps(syncs_each=syncs), steps=4))
    verdict = perf8b.sync_verdicts({"ddtree15-8b": per, "dflash-8b": {"syncs_per_round": 9}},
                                   ["ddtree15-8b", "ddtree31-8b"])
    assert verdict["ddtree15-8b"]["ok"] is ok
    assert verdict["ddtree31-8b"]["ok"] is False  # not measured is not a pass
    assert "dflash-8b" not in verdict


def test_one_batch_reads_round_cost_from_the_meta(monkeypatch: pytest.MonkeyPatch) -> None:
    from rehearsal import client

    def fake(port: int, prompts: Any, lengths: Any, **kw: Any) -> list[client.Answer]:
        return [client.Answer(output_ids=[1] * 64, meta={"e2e_latency": 0.64 + i * 0.064,
                                                         "spec_verify_ct": 64,
                                                         "spec_accept_length": 1.0})
                for i in range(len(prompts))]

    monkeypatch.setattr(client, "batch", fake)
    got = perf8b.one(1, 64, 3, 10.0)
    assert got["round_ms"] == pytest.approx(11.0)  # the median request: 0.704 s / 64 rounds
    assert got["accept_length"] == 1.0 and got["errors"] == []


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.integration
def test_snapshot_writes_the_payload_of_a_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "payload").mkdir(parents=True)
    _git(tmp_path, "init", "-q", str(repo))
    (repo / "payload" / "payload.yaml").write_text("version: old\n")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "old payload")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "payload" / "payload.yaml").write_text("version: new\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "new")
    dest = repo / perf8b.SNAPSHOT
    line = snapshot.write(first, dest, repo)
    assert (dest / "payload.yaml").read_text() == "version: old\n"
    assert line == f"{first} old payload" and perf8b.snapshot_dir(repo) == dest
    with pytest.raises(RuntimeError):
        snapshot.write("no-such-ref", dest, repo)


@pytest.mark.integration
def test_old_venv_imports_its_own_copy_and_the_base_venvs_rest(tmp_path: Path) -> None:
    base = tmp_path / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    sp = next((base / "lib").glob("python3.*/site-packages"))
    (sp / "sglang").mkdir()
    (sp / "sglang" / "__init__.py").write_text("WHO = 'base'\n")
    (sp / "sglang-0.5.11.dist-info").mkdir()
    (sp / "sglang-0.5.11.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.5.11\n")
    (sp / "other.py").write_text("X = 1\n")
    dest = perf8b.old_venv(base, tmp_path / "old")
    (next((dest / "lib").glob("python3.*/site-packages")) / "sglang" / "__init__.py") \
        .write_text("WHO = 'old'\n")  # the earlier payload patches the copy only
    code = "import sglang, other; print(sglang.WHO, other.X)"
    out = subprocess.run([str(dest / "bin" / "python"), "-c", code], check=True,
                         capture_output=True, text=True).stdout.split()
    base_out = subprocess.run([str(base / "bin" / "python"), "-c", code], check=True,
                              capture_output=True, text=True).stdout.split()
    assert out == ["old", "1"] and base_out == ["base", "1"]


@pytest.mark.integration
def test_others_are_stopped_while_one_is_timed_and_continued_after() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True) for _ in range(3)]
    pids = {f"s{i}": p.pid for i, p in enumerate(procs)}

    def state(pid: int) -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    try:
        time.sleep(0.2)
        with perf8b.others_stopped(pids, "s1"):
            time.sleep(0.1)
            assert [state(p) for p in pids.values()] == ["T", "S", "T"]
        time.sleep(0.1)
        assert all(state(p) != "T" for p in pids.values())
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_the_table_gives_ratios_and_marks_what_did_not_run() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import perf8b_table

    doc = {"perf8b": {"models": "synthetic", "timings": {
        "nospec-8b": {"batch1": {"round_ms_median": 5.0, "tok_s_median": 180.0}},
        "dflash-8b": {"batch1": {"round_ms_median": 11.5, "tok_s_median": 90.0}},
        "ddtree15-8b": {"batch1": {"round_ms_median": 7.5, "tok_s_median": 120.0}}},
        "profiles": {"ddtree15-8b": {"syncs_per_round": 1.0, "gpu_busy_ms": 7.2}},
        "syncs": {"ddtree15-8b": {"syncs_per_round": 1.0, "ok": True}}, "sync_limit": 2}}
    text = perf8b_table.render(doc, "run X")
    row = next(line for line in text.splitlines() if line.startswith("| ddtree15-8b |"))
    assert "7.50 (1.50x)" in row and "120 (1.33x)" in row and row.count("unrun") == 4
    prof = [line for line in text.splitlines() if line.startswith("| ddtree15-8b |")][1]
    assert "| 7.2 |" in prof and "| 1 |" in prof
    assert "ddtree15-8b 1.0 (ok)" in text
    assert "SGLang" not in text.splitlines()[0]  # a result from before the field


def test_the_table_names_the_release_and_the_plugins_ab() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import perf8b_table

    doc = {"sglang": "0.5.17", "perf8b": {"rounds": 5, "timings": {
        "dflash-8b": {"batch1": {"round_ms_median": 10.0, "tok_s_median": 100.0,
                                 "rounds_done": 3}},
        "ddtree15-8b-prev": {"batch1": {"round_ms_median": 20.0, "tok_s_median": 50.0,
                                        "rounds_done": 3}}}}}
    text = perf8b_table.render(doc, "final call")
    assert "; 3 (of 5 asked) alternating rounds" in text.splitlines()[0]
    assert "; SGLang 0.5.17 + the plugin" in text.splitlines()[0]
    assert "`ddtree15-8b-prev`: both verify changes off, as before them" in text
    assert "`ddtree15-8b-eagerverify`" not in text
    # the servers whose switches differ by form: said for the plugin, not for the patch set
    doc["perf8b"]["timings"]["ddtree15-8b"] = doc["perf8b"]["timings"]["dflash-8b"]
    assert "`ddtree15-8b`: both on, named (SGLANG_DDTREE_TREE_ATTENTION=1" in \
        perf8b_table.render(doc, "final call")
    assert "`ddtree15-8b`:" not in perf8b_table.render({**doc, "sglang": "0.5.11"}, "call")
    doc["perf8b"]["timings"]["ddtree31-8b"] = {"failed": ["HTTP 500"], "batch1": {
        "round_ms_median": None, "tok_s_median": None, "rounds_done": 0}}
    text = perf8b_table.render(doc, "final call")
    assert "`ddtree31-8b`: stopped answering, not measured further (HTTP 500)" in text
    assert "; 3 (of 5 asked) alternating rounds" in text.splitlines()[0]  # the others' count
    row = next(line for line in text.splitlines() if line.startswith("| ddtree15-8b-prev |"))
    assert "50 (0.50x)" in row


def test_measure_alternates_and_starts_no_round_the_call_has_no_time_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[tuple[int, int]] = []
    clock = {"left": 300.0}

    def timed(port: int, tokens: int, batch: int, timeout: float) -> dict[str, Any]:
        order.append((port, tokens))
        clock["left"] -= 10.0  # each batch of requests takes 10 s of the call
        return {"tok_s": 100.0 + port, "round_ms": 5.0 * port, "accept_length": 1.0,
                "errors": []}

    monkeypatch.setattr(perf8b, "one", timed)
    got = perf8b.measure([("a", 1), ("b", 2)], {}, rounds=5, batches=(1, 8),
                         time_left=lambda: clock["left"], reserve=70.0)
    # warm-up 4 batches (40 s), then rounds of 40 s from 260 s left: 220, 180, 140 left after
    # the first three; the fourth starts at 140 >= 40 + 70, the fifth not at 100
    rounds = [p for p, t in order if t == perf8b.TOKENS][:-2]  # then batch 1, others running
    assert rounds == [1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1]  # reversed every round
    assert got["a"]["batch1"]["rounds_done"] == 4 and got["b"]["batch8"]["rounds_done"] == 4
    assert got["b"]["batch1"]["round_ms_median"] == 10.0
    assert got["a"]["batch1_others_running"]["round_ms"] == 5.0
    # without a clock every round runs
    order.clear()
    full = perf8b.measure([("a", 1)], {}, rounds=5, batches=(1,))
    assert full["a"]["batch1"]["rounds_done"] == 5


def test_a_server_that_answers_nothing_is_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def answers(port: int, tokens: int, batch: int, timeout: float) -> dict[str, Any]:
        asked.append(port)
        if port == 2:  # died or hangs: every request of the batch an error, no token
            return {"tok_s": 0.0, "round_ms": None, "accept_length": None,
                    "errors": ["timed out"] * batch}
        return {"tok_s": 50.0, "round_ms": 9.0, "accept_length": 1.0, "errors": []}

    monkeypatch.setattr(perf8b, "one", answers)
    got = perf8b.measure([("ok", 1), ("dead", 2)], {}, rounds=3, batches=(1, 8, 32))
    assert asked.count(2) == 1 and asked.count(1) == 3 + 3 * 3 + 1
    assert got["dead"]["failed"] == ["timed out"]
    assert got["dead"]["batch1"]["rounds_done"] == 0 and "batch1_others_running" not in got["dead"]
    assert got["ok"]["batch32"]["rounds_done"] == 3 and got["ok"]["batch1"]["tok_s_median"] == 50.0
