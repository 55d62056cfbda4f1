"""`ddtree-deploy bench localhost DEPLOYMENT` end to end in plain-process mode, as on the H200
GPU host: the real H200's facts (tests/facts/inventory/h200-cu130.json, its venv pointed at a
fake venv whose python serves the lab stand-in), the deployment's rendered unit run as a plain
process, apply's lock, results with the host's facts, refusals before anything runs."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from json_envelope import check

from ddtree_deploy.bench.results import Results
from ddtree_deploy.facts.model import Facts

HERE = Path(__file__).resolve().parent
H200 = HERE / "facts" / "inventory" / "h200-cu130.json"


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    import socket

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(
        f"#!/bin/sh\nexec {sys.executable} -S {HERE / 'bench_fake_server.py'} \"$@\"\n")
    (venv / "bin" / "python").chmod(0o755)
    for name, conf in (("target", {"vocab_size": 1024}), ("draft", {"block_size": 16})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(conf))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"""version: 1
hosts:
  localhost:
    transport: local
    venvs:
      torch: {{path: {venv}, role: serving}}
deployments:
  svc:
    host: localhost
    venv: torch
    cuda_lane: cu130
    sglang: {{version: 0.5.11}}
    gpu: 0
    port: {port}
    model_path: {tmp_path / 'target'}
    draft_model_path: {tmp_path / 'draft'}
    algorithm: dflash
    attention_backend: triton
    extra_args: [--skip-tokenizer-init]
""")
    raw = json.loads(H200.read_text())["output"][0]
    facts = Facts.model_validate(raw)
    real = facts.venvs[0]
    facts.venvs[0] = real.model_copy(update={"path": str(venv)})
    monkeypatch.setattr("ddtree_deploy.cli.bench._facts", lambda *a, **k: facts)
    lock = tmp_path / "apply.lock"
    monkeypatch.setattr("ddtree_deploy.converge.lock.LOCK_FILE", str(lock))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return {"hosts": hosts, "port": port, "lock": lock, "tmp": tmp_path, "capsys": capsys}


@dataclass
class Ran:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _bench(setup: dict[str, Any], *args: str) -> Ran:
    """The CLI's own entry point (errors mapped to exit codes), in this process."""
    from ddtree_deploy.cli.app import main

    capsys: pytest.CaptureFixture[str] = setup["capsys"]
    capsys.readouterr()
    code: Any = 0
    try:
        main(["--hosts", str(setup["hosts"]), "bench", *args])
    except SystemExit as exc:
        code = exc.code
    got = capsys.readouterr()
    return Ran(int(code or 0), got.out, got.err)


def test_plain_mode_sweep_on_localhost_with_the_h200_facts(setup: dict[str, Any]) -> None:
    out = _bench(setup, "localhost", "svc", "--mode", "plain", "--configs", "none,ddtree:15/8",
                 "--concurrency", "1", "--sampling", "greedy", "--workloads", "code",
                 "--requests", "1", "--max-new-tokens", "8", "--warmup-requests", "0", "--yes",
                 "--json", "--label", "synthetic: stand-in")
    assert out.exit_code == 0, out.output
    summary = check(out.stdout, out.exit_code).results  # docs/json.md, tests/json_envelope.py
    assert summary["mode"] == "plain" and summary["measured"] == 2
    path = setup["tmp"] / "state" / "ddtree-deploy" / "bench" / "localhost" / "svc" / \
        "results.json"
    assert summary["results"] == str(path)
    results = Results.load(path)
    facts = results.data["host_facts"]
    assert facts["gpus"][0]["name"] == "NVIDIA H200" and facts["lane"] == "cu130"
    assert facts["driver_version"] and facts["torch"].startswith("2.11.0")
    flags = results.configs["ddtree-15-8"]["flags"]
    assert flags[flags.index("--port") + 1] == str(setup["port"])
    assert "--skip-tokenizer-init" in flags and "--attention-backend" in flags
    assert results.data["grid"]["prompts"] == "ids"  # from the deployment's flag
    assert results.data["synthetic"] is True
    log = Path(results.configs["ddtree-15-8"]["log"])
    assert log.parent == path.parent / "results-logs" and "Uvicorn running" in log.read_text()
    assert "pid" in setup["lock"].read_text()  # apply's lock was taken (holder written)
    again = _bench(setup, "localhost", "svc", "--mode", "plain", "--configs", "none,ddtree:15/8",
                   "--concurrency", "1", "--sampling", "greedy", "--workloads", "code",
                   "--requests", "1", "--max-new-tokens", "8", "--yes", "--json")
    assert again.exit_code == 0 and check(again.stdout, 0).results["measured"] == 0


def test_dry_run_shows_the_plan_and_starts_nothing(setup: dict[str, Any]) -> None:
    out = _bench(setup, "localhost", "--mode", "plain", "--grid",
                 str(HERE.parent / "benchmarks" / "grids" / "h200-small.yaml"), "--dry-run",
                 "--json")
    assert out.exit_code == 0, out.output
    plan = check(out.stdout, out.exit_code).results
    assert plan["dry_run"] and plan["to_measure"] == 4 * 3 * 2 * 2
    assert plan["configs"] == ["nospec", "dflash", "ddtree-15-8", "ddtree-31-8"]
    assert "--speculative-algorithm" not in plan["flags"]["nospec"]
    tree = " ".join(plan["flags"]["ddtree-31-8"])
    assert "--speculative-algorithm DDTREE --speculative-draft-model-path " in tree
    assert ("--speculative-ddtree-budget 31 --speculative-ddtree-topk 8 --attention-backend "
            "triton --skip-tokenizer-init") in tree
    assert "restart a plain process on localhost 4 time(s)" in out.stderr
    assert not setup["lock"].exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--configs", "ddtree:7/8"], "--configs ddtree:7/8: budget: DDTREE budget 7 gives a "
                                  "verify width of 8 tokens"),
    (["--configs", "dflash", "--concurrency", "1,1"], "--concurrency: give distinct values"),
    (["--mode", "cloud"], "--mode must be auto, systemd or plain"),
    (["--prompts", "text"], "runs with --skip-tokenizer-init: it takes token ids only"),
    ([], "bench restarts the service: confirm on a terminal, or pass --yes"),
])
def test_refusals_exit_2_before_anything_runs(setup: dict[str, Any], args: list[str],
                                              message: str) -> None:
    out = _bench(setup, "localhost", "svc", "--mode", "plain", "--concurrency", "1",
                 "--requests", "2", *args)
    assert out.exit_code == 2, out.output
    assert message in out.output
    assert not setup["lock"].exists()
    assert not list(setup["tmp"].rglob("results.json"))


def test_a_held_lock_refuses_the_sweep(setup: dict[str, Any]) -> None:
    from ddtree_deploy.config.hosts import load_config
    from ddtree_deploy.converge.lock import HostLock
    from ddtree_deploy.transport.connect import open_transport

    config = load_config(setup["hosts"])
    host = config.host("localhost")
    with open_transport(config, host) as t, HostLock(t, host):
        out = _bench(setup, "localhost", "svc", "--mode", "plain", "--configs", "dflash",
                     "--concurrency", "1", "--requests", "1", "--yes")
    assert out.exit_code != 0
    assert "another apply holds localhost" in out.output
    assert not list((setup["tmp"] / "state").rglob("*.log"))  # no server was started


def test_a_resume_on_another_stack_is_refused_unless_asked_and_then_marked(
        setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run 10 resumed run 7's ladder file after a payload upgrade and the report printed the new
    payload for every cell: a resume now refuses a changed stack, or records it when asked."""
    grid = ["localhost", "svc", "--mode", "plain", "--concurrency", "1", "--sampling", "greedy",
            "--workloads", "code", "--requests", "1", "--max-new-tokens", "8",
            "--warmup-requests", "0", "--yes", "--json"]
    first = _bench(setup, *grid, "--configs", "none")
    assert first.exit_code == 0, first.output
    path = Path(check(first.stdout, 0).results["results"])
    before = path.read_bytes()

    from ddtree_deploy.cli import bench as cli_bench

    facts = cli_bench._facts()  # the fixture's facts (the H200's, torch 2.11.0+cu130)
    venv = facts.venvs[0]
    assert venv.torch is not None
    newer = facts.model_copy(deep=True)
    newer.venvs[0] = venv.model_copy(update={"torch": venv.torch.model_copy(
        update={"version": "2.12.0+cu130"})})
    monkeypatch.setattr("ddtree_deploy.cli.bench._facts", lambda *a, **k: newer)

    refused = _bench(setup, *grid, "--configs", "none,ddtree:15/8")
    assert refused.exit_code == 2, refused.output
    assert "measured on another stack (torch '2.11.0+cu130' then, '2.12.0+cu130' now)" in \
        refused.output
    assert "--mixed-stack" in refused.output
    assert path.read_bytes() == before  # nothing measured, nothing written

    mixed = _bench(setup, *grid, "--configs", "none,ddtree:15/8", "--mixed-stack")
    assert mixed.exit_code == 0, mixed.output
    results = Results.load(path)
    assert results.configs["nospec"]["stack"]["torch"] == "2.11.0+cu130"
    assert results.configs["ddtree-15-8"]["stack"]["torch"] == "2.12.0+cu130"
    assert [f["torch"] for f in results.data["facts_history"]] == ["2.11.0+cu130"]
    assert results.data["host_facts"]["torch"] == "2.12.0+cu130"
    from ddtree_deploy.bench.report import build_report

    build_report(results, setup["tmp"] / "report")
    text = (setup["tmp"] / "report" / "report.md").read_text()
    assert "MIXED STACKS" in text
    assert "nospec: payload -, sglang ?, torch 2.11.0+cu130" in text
