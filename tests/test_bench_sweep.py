"""The bench sweep's mechanics in plain-process mode on this machine (the H200 host's mode):
each configuration's server started from the rendered unit with a log file and probed by PID,
measured, stopped at the end (also after Ctrl-C or SIGTERM), resumed without re-measuring, an
unhealthy configuration recorded with the probe's diagnosis. The server is the lab stand-in
(tests/bench_fake_server.py), its speed SYNTHETIC; no test looks at timings."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from foreground import sigint_default

from ddtree_deploy.bench.results import Results
from ddtree_deploy.localproc import pid_alive

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "bench_sweep_runner.py"
CELLS_PER_CONFIG = 2 * 2 * 2  # workloads x concurrency x sampling


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S {HERE / 'bench_fake_server.py'} "
                      '"$@"\n')
    python.chmod(0o755)
    for name, conf in (("target", {"vocab_size": 1024}), ("draft", {"block_size": 16})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(conf))
    return tmp_path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BENCH_FAKE_FAIL"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    return {**env, **extra}


def _run(root: Path, port: int, configs: str, **env: str) -> tuple[int, list[dict[str, Any]]]:
    out = subprocess.run([sys.executable, str(RUNNER), str(root), str(port), configs],
                         capture_output=True, text=True, timeout=600, env=_env(**env))
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert lines, out.stderr
    return out.returncode, lines


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_sweep_measures_stops_its_servers_and_resumes(root: Path) -> None:
    port = _free_port()
    code, lines = _run(root, port, "none,dflash,ddtree:15/8")
    assert code == 0
    summary = lines[-1]
    assert summary["measured"] == 3 * CELLS_PER_CONFIG and summary["unhealthy"] == []
    assert len(summary["started"]) == 3  # one restart per configuration
    assert all(not pid_alive(p) for p in summary["started"]) and not _listening(port)
    results = Results.load(root / "res" / "results.json")
    assert len(results.cells) == 3 * CELLS_PER_CONFIG
    assert all(c["metrics"]["failed"] == 0 and c["metrics"]["tokens"] > 0 for c in results.cells)
    tree = results.configs["ddtree-15-8"]
    assert tree["mode"] == "plain" and tree["probe"]["status"] == "healthy"
    assert tree["argv"][1:4] == ["-m", "sglang.launch_server", "--model-path"]
    flags = " ".join(tree["flags"])
    assert "--speculative-ddtree-budget 15 --speculative-ddtree-topk 8" in flags
    assert "Uvicorn running on" in Path(tree["log"]).read_text()  # the server's own log file
    spec_cells = [c for c in results.cells if c["config"] != "nospec"]
    assert all(c["metrics"]["accept_length"] > 1 for c in spec_cells)
    assert all(c["metrics"]["accept_length"] is None for c in results.cells
               if c["config"] == "nospec")
    csv_lines = (root / "res" / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(results.cells)
    # resume: nothing is measured again and no server is started
    code, lines = _run(root, port, "none,dflash,ddtree:15/8")
    assert code == 0 and lines[-1]["measured"] == 0 and lines[-1]["started"] == []
    assert lines[-1]["skipped"] == 3 * CELLS_PER_CONFIG
    assert len(Results.load(root / "res" / "results.json").cells) == 3 * CELLS_PER_CONFIG
    # a grid grown by one configuration restarts only for that one
    code, lines = _run(root, port, "none,dflash,ddtree:15/8,ddtree:31/8")
    assert code == 0 and lines[-1]["measured"] == CELLS_PER_CONFIG
    assert len(lines[-1]["started"]) == 1


def test_an_unhealthy_configuration_is_recorded_and_the_sweep_goes_on(root: Path) -> None:
    port = _free_port()
    code, lines = _run(root, port, "dflash,ddtree:15/8", BENCH_FAKE_FAIL="DDTREE")
    assert code == 0
    summary = lines[-1]
    assert [u["config"] for u in summary["unhealthy"]] == ["ddtree-15-8"]
    assert summary["unhealthy"][0]["diagnosis"] == ["ddtree-attention-backend"]
    results = Results.load(root / "res" / "results.json")
    assert {c["config"] for c in results.cells} == {"dflash"}
    probe = results.configs["ddtree-15-8"]["probe"]
    assert probe["status"] == "unhealthy"
    assert "--attention-backend triton" in probe["diagnosis"][0]["remedy"]
    assert all(not pid_alive(p) for p in summary["started"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_the_server_keeps_what_was_measured_and_resumes(root: Path,
                                                                     sig: signal.Signals) -> None:
    port = _free_port()
    # SIGINT at its default, as Ctrl-C finds it at a terminal (tests/foreground.py: CI's
    # background job would hand it down ignored, and the runner would rightly not stop)
    argv = sigint_default([sys.executable, str(RUNNER), str(root), str(port), "dflash,none"])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**_env(), "BENCH_RUNNER_HOLD": "1"})  # mid-way when signalled
    server = 0
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())  # the first measured cell
        server = int(first["pid"])
        assert pid_alive(server)
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            if server and pid_alive(server):  # the killed runner could not stop its server
                os.kill(server, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert json.loads(rest.splitlines()[-1])["interrupted"] is True
    deadline = time.monotonic() + 30
    while pid_alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(server) and not _listening(port)
    done = Results.load(root / "res" / "results.json").cells
    assert 1 <= len(done) < 2 * CELLS_PER_CONFIG  # mid-sweep (it waits after its first cell)
    code, lines = _run(root, port, "dflash,none")
    assert code == 0
    assert lines[-1]["measured"] == 2 * CELLS_PER_CONFIG - len(done)
    assert len(Results.load(root / "res" / "results.json").cells) == 2 * CELLS_PER_CONFIG
