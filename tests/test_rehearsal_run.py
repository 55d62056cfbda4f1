"""The GPU rehearsal's CPU-side parts: fault injection, the result schema, hosts files, checks.

The rehearsal itself needs a GPU (benchmarks/RESULTS.md has its runs); these tests pin what can
be checked here: the negative controls' faults really change the payload's behaviour, the
per-server hosts file is one the tool accepts, and the checks judge answers as intended.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rehearsal import checks, result, run  # noqa: E402
from rehearsal.designs import expected, get_design  # noqa: E402
from rehearsal.servers import Server, hosts_file  # noqa: E402

_PROBE = r"""
import sys, types, torch
m = types.ModuleType("sglang"); m.__path__ = [sys.argv[1]]; sys.modules["sglang"] = m
from sglang.srt.speculative import ddtree_verify, ddtree_sampling
mask = torch.eye(3, dtype=torch.bool).unsqueeze(0)
flat = ddtree_verify.tree_custom_mask(mask, torch.tensor([0]), 9)
gen = torch.Generator().manual_seed(3)
two = torch.rand((2, 4, 4), generator=gen) < 0.5
both = ddtree_verify.tree_custom_mask(two, torch.tensor([2, 5]), 4 * (2 + 4) + 4 * (5 + 4))
sys.stderr.write("FLAT " + "".join("1" if v else "0" for v in both.tolist()) + "\n")
index = ddtree_verify.custom_mask_index(torch.tensor([2, 5]), 4)  # what the plan graph passes
placed = ddtree_verify.tree_custom_mask(two, torch.tensor([2, 5]), 60, index=index)
sys.stderr.write("PLACED " + "".join("1" if v else "0" for v in placed.tolist()) + "\n")
logits = torch.tensor([[0.0, 3.0, 0.0]] * 400)
ones = torch.ones(400)
s = ddtree_sampling.sample_tokens(logits, ones * 4.0, torch.full((400,), 3), ones,
                                  generator=torch.Generator().manual_seed(0))
mixed = torch.arange(8.0).expand(800, 8)  # rows alternate top-k 2 and top-k unset (1 << 30)
ks = torch.tensor([2, 1 << 30]).repeat(400)
m = ddtree_sampling.sample_tokens(mixed, torch.full((800,), 50.0), ks, torch.ones(800),
                                  max_top_k=1 << 30, min_top_k=2, need_top_p=False,
                                  generator=torch.Generator().manual_seed(0))
sys.stderr.write("TOPK " + str(float((m[0::2] < 6).float().mean())) + "\n")
from sglang.srt.speculative import ddtree_admission
try:
    ddtree_admission.check_request({"sampling_params": {"frequency_penalty": 1.5}})
    sys.stderr.write("ADMIT yes\n")
except ValueError:
    sys.stderr.write("ADMIT no\n")
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
    shutil.copy(payload / "ddtree" / "admission.py", spec / "ddtree_admission.py")
    shutil.copy(payload / "sglang-0.5.11" / "srt" / "speculative" / "ddtree_verify.py",
                spec / "ddtree_verify.py")
    return pkg


def _flat(stderr: str, tag: str = "FLAT") -> str:
    return next(line[len(tag) + 1:] for line in stderr.splitlines()
                if line.startswith(tag + " "))


_last_stderr: list[str] = [""]


def _run(pkg: Path, fault: str | None) -> tuple[int, float, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if fault:
        env["REHEARSAL_FAULT"] = fault
        env["PYTHONPATH"] = str(ROOT / "rehearsal" / "faults")
    done = subprocess.run([sys.executable, "-c", _PROBE, str(pkg)], capture_output=True,
                          text=True, env=env, check=True, timeout=120)
    allowed, share = done.stdout.split()
    _last_stderr[:] = [done.stderr]
    if fault:
        assert f"REHEARSAL FAULT ACTIVE: {fault}" in done.stderr
    return int(allowed), float(share), _flat(done.stderr), _flat(done.stderr, "PLACED")


def test_faults_change_what_they_claim_and_nothing_without_them(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    clean_allowed, clean_share, clean_flat, clean_placed = _run(pkg, None)
    assert float(_flat(_last_stderr[0], "TOPK")) == 0.0  # top-k 2 keeps tokens 6 and 7 only
    assert _flat(_last_stderr[0], "ADMIT") == "no"  # a penalty is refused
    assert clean_placed == clean_flat  # the device index places the mask where offsets do
    assert clean_allowed == 3  # three slots that each see only themselves
    assert 0.4 < clean_share < 0.75  # token 1 at temperature 4: e^0.75 / (e^0.75 + 2) = 0.51
    assert len(clean_flat) == 4 * 6 + 4 * 9 and clean_flat[:2] == "11"  # prefix columns open
    mask_allowed, _, mask_flat, mask_placed = _run(pkg, "mask")
    assert mask_allowed == 5  # slot i also sees slot i + 1
    assert mask_flat != clean_flat
    assert mask_placed == mask_flat  # the fault holds when the plan graph passes the index too
    _, greedy_share, _, _ = _run(pkg, "greedy-follow")
    assert greedy_share == 1.0
    _, hot_share, _, _ = _run(pkg, "hot")
    assert hot_share > 0.8  # temperature 1: e^3 / (e^3 + 2) = 0.91
    _run(pkg, "topk-shortcut")
    assert float(_flat(_last_stderr[0], "TOPK")) > 0.5  # the whole vocabulary, nearly uniform
    _run(pkg, "admit-penalties")
    assert _flat(_last_stderr[0], "ADMIT") == "yes"  # let through (and ignored downstream)


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
    eager = Server("e", "/m", "ddtree", 15, 8, port=31004, env=run.EAGER_ROUND)
    environment = load_config(hosts_file(eager, "/v", tmp_path)).deployment("e").environment
    assert environment["SGLANG_DDTREE_ROUND_GRAPHS"] == "0"
    assert environment["HF_HUB_OFFLINE"] == "1"
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


def _isolate(monkeypatch: pytest.MonkeyPatch, work: Path, venv: Path) -> None:
    """The GPU host's scratch folder and venv (harness.WORK, harness.VENV) replaced in every
    rehearsal module that holds them: run, lineup and run_phases import the names, so
    patching one module leaves the others on /tmp/rehearsal."""
    from rehearsal import harness

    real = {"WORK": harness.WORK, "VENV": harness.VENV}
    for name, module in list(sys.modules.items()):
        if name.startswith("rehearsal."):
            for attr, value in (("WORK", work), ("VENV", venv)):
                if getattr(module, attr, None) == real[attr]:
                    monkeypatch.setattr(module, attr, value)


_WRITTEN: list[list[str]] = []  # the open recorders of _writes (the audit hook's)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _WRITTEN:
        return
    paths: tuple[Any, ...] = ()
    if event == "open":
        path, mode, flags = args
        if (mode and any(c in mode for c in "wax+")) or \
                (flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            paths = (path,)
    elif event in ("os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree", "os.symlink",
                   "os.link"):
        paths = (args[0],)
    elif event == "os.rename":
        paths = args[:2]
    for p in paths:
        if isinstance(p, (str, bytes, os.PathLike)):
            _WRITTEN[-1].append(os.path.abspath(os.fsdecode(p)))


@contextlib.contextmanager
def _writes() -> Iterator[list[str]]:
    """The paths written, made, renamed or removed while inside (an audit hook: added once)."""
    if not getattr(_audit, "added", False):
        sys.addaudithook(_audit)
        _audit.added = True  # type: ignore[attr-defined]
    _WRITTEN.append([])
    try:
        yield _WRITTEN[-1]
    finally:
        _WRITTEN.pop()


def test_the_write_recorder_sees_writes(tmp_path: Path) -> None:
    with _writes() as written:
        (tmp_path / "a").write_text("x")
        (tmp_path / "d").mkdir()
        os.replace(tmp_path / "a", tmp_path / "d" / "b")
        (tmp_path / "d" / "b").read_text()  # a read is not a write
    assert written == [str(tmp_path / "a"), str(tmp_path / "d"), str(tmp_path / "a"),
                       str(tmp_path / "d" / "b")]


@pytest.mark.parametrize(("args", "message"), [
    (["--phase", "perf", "--warm", "0", "--budget", "265"], "1 start group(s) needs at least 385"),
    (["--phase", "correctness", "--budget", "450"], "in 2 start group(s) needs at least 490 s"),
    (["--phase", "perf", "--only", "dflash-dummy,nosuch"], "no such server in phase perf: nosuch"),
    (["--phase", "perf", "--no-prewarm", "--only", "dflash-ladder"],
     "--no-prewarm: a DFLASH server probed by the tool"),
    (["--phase", "perf", "--rounds", "0"], "--rounds must be at least 1"),
    (["--phase", "bench", "--bench-runs", "dummy,dummy"], "distinct names among ladder and dummy"),
    (["--phase", "bench", "--bench-runs", ","], "distinct names among ladder and dummy"),
    (["--phase", "correctness,nosuch"], "no such phase nosuch"),
    (["--phase", "perf,perf"], "a phase named twice"),
    (["--phase", "perf,"], "comma-separated names"),
    (["--phase", "correctness,dflash-sampled", "--budget", "450"],
     "phase correctness,dflash-sampled with 12 servers in 2 start group(s)"),
    # the two describe ddtree15-ladder differently (correctness names no attention backend)
    (["--phase", "correctness,perf"], "server ddtree15-ladder differs between the phases"),
    (["--phase", "correctness,bench", "--bench-runs", "x"], "distinct names among ladder"),
])
def test_bad_options_are_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        args: list[str], message: str) -> None:
    from rehearsal import run

    work, venv = tmp_path / "work", tmp_path / "venv"
    work.mkdir()
    (work / "keep").write_text("x")
    _isolate(monkeypatch, work, venv)  # were anything to run, it would stay in tmp_path
    out = tmp_path / "out"
    with _writes() as written, pytest.raises(SystemExit) as info:
        run.main(["--carry", str(tmp_path), "--out", str(out), *args])
    assert info.value.code == 2
    assert [w for w in written if not Path(w).is_relative_to(tmp_path)
            and "__pycache__" not in Path(w).parts] == []
    assert message in capsys.readouterr().err
    assert not out.exists() and not venv.exists()
    assert [p.name for p in work.iterdir()] == ["keep"]  # the scratch folder untouched
    for name, module in sorted(sys.modules.items()):  # no module kept the GPU host's folders
        if name.startswith("rehearsal."):
            for attr in ("WORK", "VENV"):
                value = getattr(module, attr, None)
                assert value is None or value.is_relative_to(tmp_path), (name, attr, value)


def test_the_default_phases_fit_their_documented_budgets() -> None:
    """The commands in RESULTS.md's runs pass the budget check (runs 8 and 9 did run)."""
    import argparse

    from rehearsal import run

    def ns(phase: str, budget: float, warm: int, only: str = "", prewarm: bool = True) -> Any:
        return argparse.Namespace(phase=phase, budget=budget, warm=warm, only=only, rounds=3,
                                  bench_runs="ladder,dummy", no_prewarm=not prewarm)

    assert run.check_args(ns("perf", 555, 0)) is None  # run 8
    assert run.check_args(ns("correctness", 550, 2)) is None  # run 9
    assert run.check_args(ns("bench", 120, 2)) is None  # bench starts its own servers


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks" / "results" / "rehearsal")
                                        .glob("h200-run*.json")), ids=lambda p: p.name)
def test_every_committed_gpu_run_validates_against_the_schema(path: Path) -> None:
    got = result.load(str(path))
    assert got.format == 1 and got.phase in ("correctness", "perf", "dflash-sampled", "bench")
    for name, server in got.servers.items():
        assert server.probe_exit is not None or server.healthy_by, name


def test_graph_use_reads_which_batch_sizes_each_ddtree_server_captured(tmp_path: Path) -> None:
    (tmp_path / "ddtree15-x.log").write_text(
        "[t] DDTREE ready: budget=15 topk=8 block=8 mode=full-tree round_graphs=on\n"
        "[t] DDTREE round graph captured: plan bs=8\n[t] DDTREE round graph captured: walk bs=8\n"
        "[t] DDTREE round graph captured: plan bs=1\n[t] DDTREE round graph captured: walk bs=1\n")
    (tmp_path / "ddtree15-y-eager.log").write_text(
        "[t] DDTREE ready: budget=15 topk=8 block=8 mode=full-tree round_graphs=off\n")
    (tmp_path / "ddtree15-z.log").write_text(
        "[t] DDTREE ready: budget=15 topk=8 block=8 mode=full-tree round_graphs=on\n"
        "[t] DDTREE round graph captured: plan bs=2\n"
        "[t] WARNING DDTREE round graphs off (RuntimeError: boom): the round runs eagerly.\n")
    (tmp_path / "nospec.log").write_text("[t] Uvicorn running\n")
    # the plugin form's lines (ddtree_sglang.worker, .target_attention, ddtree.tree_attention)
    (tmp_path / "ddtree15-p.log").write_text(
        "[t] DDTREE tree verify attention on (max |diff| 0.00781 against the extend kernel)\n"
        "[t] DDTREE target verify: tree kernel on; CUDA graphs with the tree's mask\n"
        "[t] DDTREE ready (ddtree-sglang-plugin): budget=15 topk=8 block=16 width=16 "
        "mode=full-tree round_graphs=on\n[t] DDTREE round graph captured: plan bs=1\n")
    got = run.graph_use(tmp_path)
    assert set(got) == {"ddtree15-x", "ddtree15-y-eager", "ddtree15-z", "ddtree15-p"}
    assert got["ddtree15-x"] == {"on": True, "plan": [1, 8], "walk": [1, 8], "off": None,
                                 "tree_attention": None, "target_verify": None}
    assert got["ddtree15-y-eager"] == {"on": False, "plan": [], "walk": [], "off": None,
                                       "tree_attention": None, "target_verify": None}
    assert got["ddtree15-p"]["plan"] == [1] and got["ddtree15-p"]["on"] is True
    assert got["ddtree15-p"]["tree_attention"].startswith("on (max |diff| 0.00781")
    assert got["ddtree15-p"]["target_verify"] == "tree kernel on; CUDA graphs with the tree's mask"
    assert got["ddtree15-z"]["plan"] == [2] and "RuntimeError: boom" in got["ddtree15-z"]["off"]


def test_perf_rounds_alternate_the_order_of_the_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    from rehearsal import perf

    calls: list[int] = []

    def one(port: int, tokens: int, batch: int) -> dict[str, Any]:
        calls.append(port)
        return {"tok_s": float(port), "errors": [], "round_ms": 1.0, "accept_length": 1.0,
                "verify_ct": 1}

    monkeypatch.setattr(perf, "_one", one)
    out = perf.measure([("a", 1), ("b", 2)], rounds=3, tokens=8, batches=(1,))
    assert calls == [1, 2] + [1, 2, 2, 1, 1, 2]  # warm-up, then A B, B A, A B
    assert out["a"]["batch1"]["tok_s"] == [1.0, 1.0, 1.0]


def test_a_phase_list_runs_in_a_fixed_order_and_shares_the_servers_it_names_twice() -> None:
    from rehearsal import phases

    assert phases.parse("perf,correctness") == ("correctness", "perf")
    assert phases.parse("bench") == ("bench",)
    both = phases.union(("correctness", "dflash-sampled"), run._servers)
    assert not isinstance(both, str)
    names = [s.name for s in both]
    assert len(names) == len(set(names)) == 12  # dflash-ladder is in both
    assert "dflash-ladder" in names
    assert [s.port for s in both] == list(range(31000, 31000 + 12))
    assert phases.union(("bench",), run._servers) == []


def test_a_server_two_phases_describe_differently_is_refused() -> None:
    from rehearsal import phases

    def servers_of(phase: str) -> list[Server]:
        return [Server("same", "/m", "ddtree", 15 if phase == "perf" else 31, 8, port=1)]

    assert "server same differs between the phases" in str(
        phases.union(("correctness", "perf"), servers_of))
    assert phases.union(("perf",), servers_of) == [Server("same", "/m", "ddtree", 15, 8,
                                                          port=31000)]


def test_the_result_schema_takes_a_phase_list_and_refuses_an_unknown_phase() -> None:
    doc = {"format": 1, "phase": "correctness,perf"}
    assert result.Result.model_validate(doc).phase == "correctness,perf"
    with pytest.raises(ValueError):
        result.Result.model_validate({**doc, "phase": "correctness,nosuch"})


def test_the_request_parameter_phase_shares_a_call_with_perf_and_judges_its_controls() -> None:
    from rehearsal import phases, request_params

    both = phases.union(phases.parse("perf,request-params"), run._servers)  # type: ignore[arg-type]
    assert not isinstance(both, str) and len(both) == 16
    mine = run._servers("request-params")
    assert all(dict(s.env)["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] == "1" for s in mine)
    faults = {s.name: s.fault for s in mine if s.fault}
    assert faults == {"rp-ddtree15-topkfault": "topk-shortcut",
                      "rp-ddtree15-penaltyfault": "admit-penalties"}
    assert all(not s.cuda_graph for s in mine if s.fault)  # controls graphs-off
    assert {(s.budget, s.cuda_graph) for s in mine if s.algorithm == "ddtree" and not s.fault} \
        == {(15, True), (31, False)}  # two budgets, graphs on and off

    def checks(**ok: bool) -> dict[str, dict[str, Any]]:
        return {f"request-params/{name.replace('_', '-')}/greedy": {"ok": v}
                for name, v in ok.items()}

    good = checks(rp_ddtree15=True, rp_ddtree31_nograph=True, rp_ddtree15_topkfault=False,
                  rp_ddtree15_penaltyfault=False, rp_dflash=False)
    assert request_params.verdict(good)["ok"]
    assert request_params.verdict(good)["anchor"] == {"rp-dflash": False}  # measured, not judged
    control_passed = {**good, **checks(rp_ddtree15_penaltyfault=True)}
    assert not request_params.verdict(control_passed)["ok"]
    ddtree_failed = {**good, "request-params/rp-ddtree15/abort": {"ok": False}}
    assert not request_params.verdict(ddtree_failed)["ok"]
    assert not request_params.verdict({})["ok"]  # nothing measured is no pass


_PLUGIN_PROBE = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from ddtree_sglang import verify
from ddtree import sampling, admission
mask = torch.eye(3, dtype=torch.bool).unsqueeze(0)
print(int(verify.tree_custom_mask(mask, torch.tensor([0]), 9).sum()),
      float((sampling.sample_tokens(torch.tensor([[0.0, 3.0, 0.0]] * 200), torch.ones(200) * 4.0,
                                    torch.full((200,), 3), torch.ones(200)) == 1).float().mean()))
"""


@pytest.mark.parametrize(("fault", "module"), [
    ("mask", "ddtree_sglang.verify"), ("greedy-follow", "ddtree.sampling"),
    ("admit-penalties", "ddtree.admission")])
def test_faults_reach_the_plugin_forms_modules(tmp_path: Path, fault: str, module: str) -> None:
    import importlib.util
    import zipfile

    spec = importlib.util.spec_from_file_location("ddtree_plugin_build",
                                                  ROOT / "payload" / "plugin" / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    site = tmp_path / "site"
    with zipfile.ZipFile(build.build_wheel(tmp_path)) as zf:
        zf.extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    clean = subprocess.run([sys.executable, "-c", _PLUGIN_PROBE, str(site)], capture_output=True,
                           text=True, env=env, check=True, timeout=120)
    env |= {"REHEARSAL_FAULT": fault, "PYTHONPATH": str(ROOT / "rehearsal" / "faults")}
    done = subprocess.run([sys.executable, "-c", _PLUGIN_PROBE, str(site)], capture_output=True,
                          text=True, env=env, check=True, timeout=120)
    assert f"REHEARSAL FAULT ACTIVE: {fault} in {module}" in done.stderr
    assert "REHEARSAL FAULT" not in clean.stderr
    allowed, share = (float(v) for v in done.stdout.split())
    clean_allowed, clean_share = (float(v) for v in clean.stdout.split())
    if fault == "mask":
        assert (clean_allowed, allowed) == (3, 5)  # slot i also sees slot i + 1
    elif fault == "greedy-follow":
        assert clean_share < 0.8 and share == 1.0


def test_on_the_plugin_form_the_lossless_checks_run_the_default_and_one_server_switched_off(
        tmp_path: Path) -> None:
    from rehearsal import phases, servers

    switches = ("SGLANG_DDTREE_TREE_ATTENTION", "SGLANG_DDTREE_VERIFY_GRAPH")
    for phase in ("correctness", "request-params"):
        patch_set = {s.name: s for s in run._servers(phase)}
        plugin = {s.name: s for s in run._servers(phase, sglang="0.5.17")}
        assert plugin.keys() == patch_set.keys()
        assert not any(k in switches for s in patch_set.values() for k, _ in s.env)
        for name, s in plugin.items():
            if s.algorithm != "ddtree" or name not in servers.PLUGIN_SWITCHED_OFF:
                assert s == patch_set[name]  # the plugin's default (both on): nothing set
                continue
            assert s.env == (*patch_set[name].env, *servers.PLUGIN_OFF)
            unit = hosts_file(s, "/venv", tmp_path).read_text()  # what the tool renders from
            assert "SGLANG_DDTREE_TREE_ATTENTION: '0'" in unit
            assert "SGLANG_DDTREE_VERIFY_GRAPH: '0'" in unit
    # one DDTREE server of correctness checks the eager path (both 0) against the same references
    assert {s.name for s in run._servers("correctness", sglang="0.5.17")
            if s.algorithm == "ddtree" and set(switches) & {k for k, _ in s.env}} == \
        {"ddtree31-ladder"}
    assert dict(servers.PLUGIN_OFF) == dict.fromkeys(switches, "0")
    both = phases.union(phases.parse("correctness,request-params"),  # type: ignore[arg-type]
                        lambda p: run._servers(p, sglang="0.5.17"))
    assert not isinstance(both, str) and len(both) == 18
    # a server that names a switch itself keeps its own value; the patch set takes none
    own = Server("ddtree31-ladder", "/m", "ddtree", 15, 8,
                 env=(("SGLANG_DDTREE_VERIFY_GRAPH", "1"),))
    assert servers.switched(([own]), "0.5.17")[0].env == (
        ("SGLANG_DDTREE_VERIFY_GRAPH", "1"), ("SGLANG_DDTREE_TREE_ATTENTION", "0"))
    assert servers.switched([own], "0.5.11") == [own]
