"""`ddtree-deploy payload` as a user runs it (a local host of a hosts file, a fake sglang venv):
the exit codes of status and verify (issue 14), and what an upgrade prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from payload_fakes import fake_venv, payload_folder


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "cache"), NO_COLOR="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                           str(root / "hosts.yaml"), "payload", *args], capture_output=True,
                          text=True, timeout=120, check=False, env=env)


def setup(root: Path) -> Path:
    venv = fake_venv(root)
    (root / "hosts.yaml").write_text(f"version: 1\nhosts:\n  ws:\n    transport: local\n"
                                     f"    venvs:\n      t: {{path: {venv}, role: serving}}\n")
    return venv


def test_status_exits_1_when_a_state_cannot_be_read_and_0_when_it_can(tmp_path: Path) -> None:
    venv = setup(tmp_path)
    assert cli(tmp_path, "deploy", "ws", "--venv", str(venv), "--payload",
               str(payload_folder(tmp_path))).returncode == 0
    good = cli(tmp_path, "status", "ws", "--json")
    assert good.returncode == 0, good.stdout + good.stderr
    assert json.loads(good.stdout)["results"][str(venv)]["version"] == "0.2.0"
    (venv / ".ddtree-deploy/payload.json").write_text('{"payload": "ddtree"}')
    bad = cli(tmp_path, "status", "ws", "--json")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "is not a payload state" in json.loads(bad.stdout)["results"][str(venv)]["error"]
    table = cli(tmp_path, "status", "ws")
    assert table.returncode == 1 and "Traceback" not in table.stderr


def test_verify_without_a_payload_answers_json_and_exits_1(tmp_path: Path) -> None:
    venv = setup(tmp_path)
    r = cli(tmp_path, "verify", "ws", "--venv", str(venv), "--payload",
            str(payload_folder(tmp_path)), "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout) == {
        "ok": True, "results": {"venv": str(venv), "action": "no payload deployed"},
        "exit_code": 1, "schema": 1}


def test_an_upgrade_says_from_what(tmp_path: Path) -> None:
    venv = setup(tmp_path)
    old = payload_folder(tmp_path, version="0.1.0")
    new = payload_folder(tmp_path, version="0.2.0", worker="W = 3\n")
    assert cli(tmp_path, "deploy", "ws", "--venv", str(venv), "--payload", str(old)
               ).returncode == 0
    r = cli(tmp_path, "deploy", "ws", "--venv", str(venv), "--payload", str(new))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "upgraded (sglang 0.5.11, payload 0.2.0, was ddtree 0.1.0 (content " in r.stdout
