"""`ddtree-deploy bench` against a lab host's systemd over real SSH, run as a user runs it.

A deployment on ct129 (a clone of ml-env with the DDTree payload, GPU 0) is installed with
`service up`; its unit then gets a hand-written comment (trailing blanks, a Latin-1 byte), so
that only a byte-for-byte restore gives it back. Then the sweep's mechanics: apply's per-host lock
held throughout (a concurrent `apply` and a second `bench` are refused naming the sweep's PID),
the unit put back byte for byte and running or stopped (and enabled or not) as before, resume
measuring nothing twice, Ctrl-C (SIGINT: exit 130, unit back, what was measured kept, resume
completes the rest), and the results file with the host's facts and each run's exact flags.

The server is the lab's SGLang stand-in: its speed and acceptance are SYNTHETIC functions of
budget, top-k and concurrency (lab/.../speedmodel.py). The only property of that model asserted
here is DDTREE accepting more per round than DFLASH; nothing looks at timings.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from foreground import sigint_default

from ddtree_deploy.config.hosts import Config, load_config
from ddtree_deploy.errors import DeployError
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

pytestmark = pytest.mark.lab
HOST = "ct129"
SOURCE_VENV = "/root/ml-env"
VENV = "/root/bench-env"
DEP = "bench-lab"
UNIT = f"{DEP}.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
PORT = 30077
TARGET = "/dev/shm/Qwen3.6-27B"
DRAFT = "/dev/shm/Qwen3.6-27B-DFlash-b16"
# A note an operator left in the unit: trailing blanks and a Latin-1 byte (not UTF-8), which a
# re-render or a decode-and-encode round trip would not give back.
HAND_NOTE = b"# tuned by hand on 2026-12-01 (r\xe9vision 2)  \n"
CELL_LINE = re.compile(r"^  \S+ code c=\d+ greedy: .* tok/s, accept ")


def hosts_file(lab: Config, path: Path) -> Path:
    ct = lab.host(HOST)
    path.write_text(f"""version: 1
hosts:
  {HOST}:
    address: {ct.address}
    port: {ct.port}
    user: root
    identity_file: {ct.identity_file}
    known_hosts: {ct.known_hosts}
    venvs:
      ml-env: {{path: {SOURCE_VENV}, role: source}}
      bench-env: {{path: {VENV}, role: serving}}
    models:
      default: {TARGET}
      draft: {DRAFT}
deployments:
  {DEP}:
    host: {HOST}
    venv: bench-env
    cuda_lane: cu130
    sglang: {{version: 0.5.11}}
    payload: true
    gpu: 0
    port: {PORT}
    draft_model_path: {DRAFT}
    algorithm: dflash
    attention_backend: triton
    grammar_backend: none
    environment: {{DDTREE_LAB_STANDIN_GATE: {GATE}}}
""")
    return path


# The stand-in's lab-only gate: while this file exists, its second and later starts wait before
# they listen (ddtree_lab_standin/launch_server.py), so a signal finds the sweep mid-way.
GATE = "/run/ddtree-bench-gate"


def cli(hosts: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts),
                           *args], capture_output=True, text=True, timeout=timeout, check=False)


def sh(hosts: Path, script: str, *args: str) -> str:
    config = load_config(hosts)
    with open_transport(config, HOST) as t:
        r = t.run(Command.shell(script, *args), timeout=120)
    assert r.ok, f"{script}: {r.stderr}"
    return r.stdout


def unit_bytes(hosts: Path) -> bytes:
    config = load_config(hosts)
    buf = io.BytesIO()
    with open_transport(config, HOST) as t:
        t.get_stream(UNIT_PATH, buf)
    return buf.getvalue()


def state(hosts: Path) -> dict[str, str]:
    """The unit's systemd state: active/inactive, enabled/disabled, its main PID."""
    out = sh(hosts, 'systemctl is-active "$1"; systemctl is-enabled "$1"; '
                    'systemctl show -p MainPID --value "$1"; true', UNIT).split()
    return {"active": out[0], "enabled": out[1], "pid": out[2]}


def gpu0_pids(hosts: Path) -> list[str]:
    out = sh(hosts, "nvidia-smi --query-compute-apps=pid --format=csv,noheader")
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


@pytest.fixture(scope="module", autouse=True)
def venv_removed_at_the_end(lab_session: None) -> Iterator[None]:
    """The payload's venv clone is made by the first test and removed after the last."""
    yield
    lab = load_config(embedded_hosts_file())
    try:
        with open_transport(lab, HOST) as t:
            t.run(Command.of("rm", "-rf", VENV), timeout=120)
    except DeployError:
        pass  # the lab is already down: nothing is left of it


@dataclass
class Setup:
    hosts: Path
    tmp: Path
    original: bytes


@pytest.fixture()
def setup(lab: Config, tmp_path: Path) -> Iterator[Setup]:
    """The deployment's unit installed and running, with the operator's note in it."""
    hosts = hosts_file(lab, tmp_path / "hosts.yaml")
    if sh(hosts, '[ -x "$1/bin/python" ] && echo yes || true', VENV).strip() != "yes":
        r = cli(hosts, "venv", "clone", HOST, SOURCE_VENV, VENV)
        assert r.returncode == 0, r.stdout + r.stderr
    r = cli(hosts, "payload", "deploy", HOST, "--venv", VENV, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        r = cli(hosts, "service", "up", HOST, DEP, "--deadline", "120")
        assert r.returncode == 0 and "healthy" in r.stdout, r.stdout + r.stderr
        rendered = unit_bytes(hosts)
        assert b"--speculative-algorithm DFLASH" in rendered
        original = rendered + HAND_NOTE
        config = load_config(hosts)
        with open_transport(config, HOST) as t:
            t.put_stream(io.BytesIO(original), UNIT_PATH, mode=0o644)
            t.run(Command.of("systemctl", "daemon-reload"), timeout=60).check()
        assert unit_bytes(hosts) == original
        yield Setup(hosts, tmp_path, original)
    finally:
        cli(hosts, "service", "down", HOST, DEP, "--remove")


def bench_argv(s: Setup, results: Path, configs: str, concurrency: str, prompts: str
               ) -> list[str]:
    return [sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(s.hosts), "bench", HOST,
            DEP, "--configs", configs, "--concurrency", concurrency, "--sampling", "greedy",
            "--workloads", "code", "--requests", "2", "--max-new-tokens", "32",
            "--warmup-requests", "1", "--prompts", prompts, "--deadline", "120",
            "--warmup", "120", "--results", str(results), "--yes", "--json"]


class Sweep:
    """A bench running in the background; its stderr read line by line.

    Started with SIGINT at its default, as from a terminal (tests/foreground.py: a CI shell's
    background job inherits SIGINT ignored, and bench rightly keeps it so)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(sigint_default(argv), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.watchdog = threading.Timer(540, self.proc.kill)
        self.watchdog.start()

    def first_cell(self) -> str:
        """Wait for the line of the first measured cell."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if CELL_LINE.match(line):
                return line
        raise AssertionError("bench ended before measuring a cell:\n" + "".join(self.lines))

    def finish(self) -> tuple[int, str, str]:
        """Wait for the end; stdout, and all of stderr. The rest of stderr is read through the
        same file object as the lines before: its buffer may hold lines already read ahead
        (communicate() reads the pipe itself and would lose them)."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        stderr = self.proc.stderr
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.append(stderr.read()), daemon=True)
        reader.start()
        out = self.proc.stdout.read()  # both end at the latest when the watchdog kills it
        reader.join()
        self.proc.wait()
        self.watchdog.cancel()
        return self.proc.returncode, out, "".join(self.lines + rest)

    def stop(self) -> None:
        self.watchdog.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def cells_by_config(results: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(c["config"], c["concurrency"]): c for c in results["cells"]}


def test_sweep_holds_the_lock_puts_the_running_unit_back_and_resumes(setup: Setup) -> None:
    before = state(setup.hosts)
    assert before["active"] == "active" and before["enabled"] == "enabled"
    results = setup.tmp / "results.json"
    argv = bench_argv(setup, results, "dflash,ddtree:15/8", "1", "text")
    sweep = Sweep(argv)
    try:
        sweep.first_cell()
        # The sweep is paused between cells, so its lock is certainly held while we ask.
        os.kill(sweep.proc.pid, signal.SIGSTOP)
        try:
            applied = cli(setup.hosts, "apply", HOST, "--yes")
            other = setup.tmp / "other.json"
            second = cli(setup.hosts, *bench_argv(setup, other, "dflash", "1", "text")[5:])
        finally:
            os.kill(sweep.proc.pid, signal.SIGCONT)
        code, out, err = sweep.finish()
    finally:
        sweep.stop()
    holder = f"pid {sweep.proc.pid}"
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert f"another apply holds {HOST}" in applied.stdout + applied.stderr
    assert holder in applied.stdout + applied.stderr
    assert second.returncode == 1, second.stdout + second.stderr
    refusal = json.loads(second.stdout)
    said = refusal["error"]["message"]  # cli/errdoc.py's shape
    assert f"another apply holds {HOST}" in said and holder in said
    assert not other.exists()

    assert code == 0, err
    summary = json.loads(out)["results"]  # docs/json.md
    assert summary["mode"] == "systemd" and summary["measured"] == 2
    assert summary["unhealthy"] == [] and summary["interrupted"] is False
    assert summary["restored"] == f"{UNIT} put back byte for byte and restarted"
    back = unit_bytes(setup.hosts)
    assert hashlib.sha256(back).hexdigest() == hashlib.sha256(setup.original).hexdigest()
    assert back == setup.original
    after = state(setup.hosts)
    assert after["active"] == "active" and after["enabled"] == "enabled"
    assert after["pid"] != before["pid"]  # the sweep restarted it; it runs the original again
    assert gpu0_pids(setup.hosts) == [after["pid"]]

    data = json.loads(results.read_text())
    facts = data["host_facts"]
    assert facts["host"] == HOST and facts["venv"] == VENV
    assert [(g["index"], g["name"]) for g in facts["gpus"]] == [(0, "NVIDIA RTX A6000")]
    assert facts["driver_version"] and facts["cuda_version"] == "13.0"
    assert facts["lane"] == "cu130" and facts["sglang"] == "0.5.11" and facts["payload"]
    assert data["grid"]["prompts"] == "text" and data["grid"]["drafter_block"] == 16
    for key, algorithm in (("dflash", "DFLASH"), ("ddtree-15-8", "DDTREE")):
        conf = data["configs"][key]
        assert conf["mode"] == "systemd" and conf["probe"]["status"] == "healthy"
        assert conf["flags"] == summary["flags"][key]  # the exact flags it ran with
        flags = " ".join(conf["flags"])
        assert f"--speculative-algorithm {algorithm} " in flags
        assert f"--port {PORT}" in flags and f"--model-path {TARGET}" in flags
        assert ("--speculative-ddtree-budget 15 --speculative-ddtree-topk 8" in flags) == \
            (key == "ddtree-15-8")
    cells = cells_by_config(data)
    assert set(cells) == {("dflash", 1), ("ddtree-15-8", 1)}
    assert all(c["metrics"]["failed"] == 0 and c["metrics"]["tokens"] == 64
               for c in cells.values())
    # the stand-in's SYNTHETIC acceptance: the tree accepts more per round than the chain
    assert cells[("ddtree-15-8", 1)]["metrics"]["accept_length"] > \
        cells[("dflash", 1)]["metrics"]["accept_length"] > 1

    # resume: everything is measured; nothing restarts, the results file is not rewritten
    saved = results.read_bytes()
    again = cli(setup.hosts, *argv[5:])
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = json.loads(again.stdout)["results"]
    assert resumed["measured"] == 0 and resumed["already"] == 2 and resumed["configs"] == []
    assert results.read_bytes() == saved
    assert state(setup.hosts) == after and unit_bytes(setup.hosts) == setup.original


def test_ctrl_c_puts_the_stopped_unit_back_keeps_what_was_measured_and_resume_completes(
        setup: Setup) -> None:
    r = cli(setup.hosts, "service", "down", HOST, DEP)  # installed, stopped and disabled
    assert r.returncode == 0, r.stdout + r.stderr
    before = state(setup.hosts)
    assert before["active"] == "inactive" and before["enabled"] == "disabled"
    results = setup.tmp / "results.json"
    argv = bench_argv(setup, results, "dflash,ddtree:15/8,ddtree:31/8", "1,2", "ids")
    total = 3 * 2
    sh(setup.hosts, 'rm -f "$1.starts" && touch "$1"', GATE)  # the 2nd start waits while it exists
    sweep = Sweep(argv)
    try:
        sweep.first_cell()
        sweep.first_cell()  # dflash's second and last cell: ddtree-15-8's start waits at the gate
        sweep.proc.send_signal(signal.SIGINT)
        code, out, err = sweep.finish()
        starts = sh(setup.hosts, 'cat "$1.starts"', GATE).split()
    finally:
        sweep.stop()
        sh(setup.hosts, 'rm -f "$1" "$1.starts"', GATE)
    # dflash's start, and ddtree-15-8's if the signal came after it began (it waited there):
    # either way the sweep could not have finished before the signal, and it stopped there (a
    # third is ddtree-31-8's: the signal went unheeded, as when SIGINT came in ignored)
    assert len(starts) in (1, 2), err
    assert code == 130, err
    assert "ddtree-31-8: restarting" not in err  # stopped in ddtree-15-8's start, or before it
    assert "putting back the service as it was" in err
    assert f"{UNIT} put back byte for byte (stopped, as it was)" in err
    assert "Traceback" not in err
    assert unit_bytes(setup.hosts) == setup.original
    after = state(setup.hosts)
    assert (after["active"], after["enabled"]) == ("inactive", "disabled")
    assert gpu0_pids(setup.hosts) == []  # the sweep's server is gone
    kept = json.loads(results.read_text())
    assert len(kept["cells"]) == 2  # dflash's two cells; the next start was held at the gate
    assert kept["grid"]["prompts"] == "ids"
    doc = json.loads(out)  # --json: what was measured and put back, also when interrupted
    said = doc["results"]
    assert said["interrupted"] is True and doc["exit_code"] == 130
    assert said["measured"] == len(kept["cells"])
    assert said["restored"].startswith(f"{UNIT} put back byte for byte (stopped, as it was)")

    again = cli(setup.hosts, *argv[5:])
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = json.loads(again.stdout)["results"]
    assert resumed["already"] == len(kept["cells"])
    assert resumed["measured"] == total - len(kept["cells"])
    data = json.loads(results.read_text())
    assert data["cells"][:len(kept["cells"])] == kept["cells"]  # measured once, kept as they were
    cells = cells_by_config(data)
    assert len(data["cells"]) == len(cells) == total
    assert all(c["metrics"]["failed"] == 0 for c in cells.values())
    for n in (1, 2):
        assert cells[("ddtree-15-8", n)]["metrics"]["accept_length"] > \
            cells[("dflash", n)]["metrics"]["accept_length"]
    assert unit_bytes(setup.hosts) == setup.original
    assert (state(setup.hosts)["active"], state(setup.hosts)["enabled"]) == \
        ("inactive", "disabled")
