"""inventory and doctor against the lab, through the real console entry point."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.rules.venv_lane import lane

pytestmark = pytest.mark.lab


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def facts_of(stdout: str) -> dict[str, Facts]:
    return {d["host"]: Facts.model_validate(d) for d in json.loads(stdout)["results"]
            if "nvidia" in d}


def test_inventory_shows_dead_busy_and_lanes(lab: Config) -> None:
    r = cli("--hosts", str(lab.path), "inventory", "ct129", "ct200", "--json", "--refresh")
    assert r.returncode == 0, r.stderr
    facts = facts_of(r.stdout)
    ct129, ct200 = facts["ct129"], facts["ct200"]
    dead = [g.index for g in ct129.nvidia.gpus if g.dead]
    assert dead == [1]
    gpu0 = ct200.nvidia.gpus[0]
    (holder,) = gpu0.processes
    assert holder.ports == [30000] and holder.unit == "qwen-wrapper.service"
    assert all(not g.processes for g in ct200.nvidia.gpus[1:])
    lanes = {v.path: lane(v).lane for f in (ct129, ct200) for v in f.venvs if v.exists}
    assert lanes["/root/ml-env"] == "cu130"
    assert lanes["/root/venv"] == "cu128" and lanes["/root/venv_sglang"] == "cu128"
    ml_env = ct129.venv("/root/ml-env")
    assert ml_env is not None and ml_env.sglang is not None
    assert "dflash_worker.py" in ml_env.sglang.dflash_modules
    assert ml_env.sglang.knows_ddtree is False
    # the session's environment kept (HOME, XDG_*: where the lab's key and known_hosts are)
    table = cli("--hosts", str(lab.path), "inventory", "ct129", "ct200", env={
        **os.environ, "COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert table.returncode == 0, table.stderr
    assert "DEAD" in table.stdout and "port 30000" in table.stdout and "cu128" in table.stdout


def test_inventory_reuses_fresh_facts_and_refresh_gathers_anew(lab: Config) -> None:
    first = facts_of(cli("--hosts", str(lab.path), "inventory", "ct129", "--json").stdout)
    again = facts_of(cli("--hosts", str(lab.path), "inventory", "ct129", "--json").stdout)
    assert again["ct129"].taken_at == first["ct129"].taken_at
    fresh = facts_of(cli("--hosts", str(lab.path), "inventory", "ct129", "--json",
                         "--refresh").stdout)
    assert fresh["ct129"].taken_at > first["ct129"].taken_at


def test_unreachable_host_is_a_row_and_exit_3(lab: Config, tmp_path: Path) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ct129 = lab.host("ct129")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        "version: 1\nhosts:\n"
        f"  ct129:\n    address: {ct129.address}\n    identity_file: {ct129.identity_file}\n"
        f"    known_hosts: {ct129.known_hosts}\n"
        f"  gone:\n    address: 127.0.0.1\n    port: {port}\n    connect_timeout: 2\n"
    )
    r = cli("--hosts", str(hosts), "inventory", "--json", "--refresh")
    assert r.returncode == 3
    rows = {d["host"]: d for d in json.loads(r.stdout)["results"]}
    assert "unreachable" in rows["gone"]["error"]["message"]
    assert rows["ct129"]["nvidia"]["gpus"]


def test_doctor_lists_every_problem_of_the_first_attempt_venv(lab: Config) -> None:
    r = cli("--hosts", str(lab.path), "doctor", "ct200", "--venv", "/root/venv_sglang", "--json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)["results"]
    assert report["host"] == "ct200" and report["venv"] == "/root/venv_sglang"
    ids = {f["id"] for f in report["findings"]}
    assert {
        "deploy.no-dflash",  # sglang 0.5.10 has no DFlash modules
        "venv.flashinfer-mxfp8",  # flashinfer 0.6.3 without mm_mxfp8
        "venv.xgrammar-structural-tag",  # xgrammar 0.1.10
        "venv.soundfile-missing",
        "deploy.lane-mismatch",  # cu128 where the deployment needs cu130
        "venv.flashinfer-sm12",  # SM 12.0 with FlashInfer and nvcc 12.8
    } <= ids
    for f in report["findings"]:
        assert f["evidence"] and f["severity"] in ("error", "warning", "info")
        assert f["remedy"] or f["severity"] == "info"
    lane_finding = next(f for f in report["findings"] if f["id"] == "deploy.lane-mismatch")
    assert "overlay" in lane_finding["remedy"] and "cu130" in lane_finding["remedy"]


def test_doctor_on_the_working_venv_finds_no_error(lab: Config) -> None:
    r = cli("--hosts", str(lab.path), "doctor", "ct129", "--venv", "/root/ml-env", "--json")
    report = json.loads(r.stdout)["results"]
    assert [f["id"] for f in report["findings"] if f["severity"] == "error"] == []
    assert r.returncode == 0


def test_doctor_checks_the_model_fit_of_the_deployment(lab: Config) -> None:
    r = cli("--hosts", str(lab.path), "doctor", "ct200", "--deployment", "sglang-ddtree",
            "--json", "--refresh")
    report = json.loads(r.stdout)["results"]
    fit = next(f for f in report["findings"] if f["id"] == "model.fit")
    assert 25600 in fit["evidence"].values() or "25600" in json.dumps(fit["evidence"])
    ids = {f["id"] for f in report["findings"]}
    assert "model.target-config-missing" not in ids and "model.draft-config-missing" not in ids
