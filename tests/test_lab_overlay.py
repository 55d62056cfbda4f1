"""overlay in the lab: ct129's cu130 lane onto a clone of ct200's cu128 venv, through the
workstation; idempotent, reversible, and consistent when the CLI is killed at random points."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddtree_deploy import xdg
from ddtree_deploy.config.hosts import Config
from ddtree_deploy.overlay import apply as remote_apply
from ddtree_deploy.overlay.lanefile import load_lane
from ddtree_deploy.overlay.manifest import read_manifest
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

pytestmark = pytest.mark.lab
VENV = "/root/venv-ovl"


def cli(lab: Config, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(lab.path),
                           *args], capture_output=True, text=True, timeout=300, check=False)


def lane_state(lab: Config) -> dict[str, dict[str, str]]:
    """name -> {path: sha256} of the lane's distributions on the target (.pyc left out)."""
    lane = load_lane("cu130")
    with open_transport(lab, "ct200") as t:
        m = read_manifest(t, VENV, lane.target_patterns()).manifest
    return {n: {f.path: f.sha256 for f in d.files if not f.path.endswith(".pyc")}
            for n, d in m.dists.items()}


def overlay(lab: Config, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(lab, "overlay", "--abi", "cu130", "--to", "ct200", "--venv", VENV, "--json", *extra)


@pytest.fixture(scope="module")
def states(lab_session: None) -> dict[str, dict[str, dict[str, str]]]:
    from ddtree_deploy.config.hosts import load_config
    from ddtree_deploy.resources import embedded_hosts_file

    lab = load_config(embedded_hosts_file())
    with open_transport(lab, "ct200") as t:
        t.run(Command.shell('rm -rf "$1"', VENV), timeout=60).check()
    assert cli(lab, "venv", "clone", "ct200", "/root/venv", VENV).returncode == 0
    old = lane_state(lab)
    r = overlay(lab)
    assert r.returncode == 0, r.stderr
    new = lane_state(lab)
    assert cli(lab, "overlay", "rollback", "ct200", "--venv", VENV).returncode == 0
    assert lane_state(lab) == old
    return {"old": old, "new": new}


def test_overlay_round_trip(lab: Config, states: dict) -> None:
    dry = overlay(lab, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["results"]  # docs/json.md
    actions = {c["name"]: c["action"] for c in plan["changes"]}
    assert actions["torch"] == "replace" and actions["sglang-kernel"] == "add"
    assert actions["nvidia-cuda-runtime-cu12"] == "remove"
    assert lane_state(lab) == states["old"]  # a dry run changes nothing
    r = overlay(lab)
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)["results"]
    assert done["result"] == "applied" and all(c["ok"] for c in done["checks"])
    assert lane_state(lab) == states["new"]
    assert not any(n.endswith("-cu12") for n in states["new"])  # superseded: removed
    again = json.loads(overlay(lab).stdout)["results"]
    assert again["result"] == "unchanged" and again["bytes_fetched"] == 0
    doctor = json.loads(cli(lab, "doctor", "ct200", "--venv", VENV, "--json",
                            "--refresh").stdout)["results"]
    assert "venv.lane-mix" not in {f["id"] for f in doctor["findings"]}
    history = cli(lab, "overlay", "history", "ct200", "--venv", VENV).stdout
    assert '"result": "applied"' in history
    assert cli(lab, "overlay", "rollback", "ct200", "--venv", VENV).returncode == 0
    assert lane_state(lab) == states["old"]


def _settle(lab: Config) -> None:
    """Wait until no apply holds the target's lock (the detached run finishes or recovers)."""
    deadline = time.monotonic() + 120
    with open_transport(lab, "ct200") as t:
        while time.monotonic() < deadline:
            st = remote_apply.status(t, VENV)
            if not st.get("locked") and not st.get("lock_holder"):
                return
            time.sleep(0.5)
    raise AssertionError(f"the apply on {VENV} did not settle: {st}")


def test_killing_the_cli_never_mixes_old_and_new(lab: Config, states: dict) -> None:
    seed = int(os.environ.get("DDTREE_FAULT_SEED", "20261129"))
    rng = random.Random(seed)
    blobs = xdg.cache_dir() / "blobs"
    t0 = time.monotonic()
    assert overlay(lab).returncode == 0
    full = time.monotonic() - t0
    assert cli(lab, "overlay", "rollback", "ct200", "--venv", VENV).returncode == 0
    for trial in range(20):
        wipe = rng.random() < 0.5  # half the trials also transfer (an empty workstation cache)
        if wipe and blobs.exists():
            shutil.rmtree(blobs)
        delay = rng.uniform(0.0, full * (1.6 if wipe else 1.1))
        print(f"trial {trial}: seed {seed}, wipe cache {wipe}, kill after {delay:.2f}s")
        proc = subprocess.Popen(
            [sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(lab.path), "overlay",
             "--abi", "cu130", "--to", "ct200", "--venv", VENV],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(delay)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _settle(lab)
        now = lane_state(lab)
        assert now in (states["old"], states["new"]), f"trial {trial} (seed {seed}) mixed lanes"
        cached_before = {p.name for p in Path(blobs).rglob("*.zst")} if blobs.exists() else set()
        r = overlay(lab)
        assert r.returncode == 0, f"trial {trial}: re-run failed: {r.stderr}"
        report = json.loads(r.stdout)["results"]
        assert lane_state(lab) == states["new"]
        if len(cached_before) >= len({s for d in states["new"].values() for s in d.values()}):
            assert report["bytes_fetched"] == 0, f"trial {trial}: re-sent cached bytes"
        assert cli(lab, "overlay", "rollback", "ct200", "--venv", VENV).returncode == 0
        assert lane_state(lab) == states["old"]
