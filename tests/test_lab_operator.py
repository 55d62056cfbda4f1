"""The operator's path in the lab (issue 30): what needs real SSH and systemd.

- item 2: `overlay history ct200` over SSH writes nothing in any declared venv (training,
  scratch, serving: a missing one stays missing);
- item 5: `plan` over ct200 and an unreachable host shows ct200's plan and exits 3;
- item 7: against real systemd, `service down` of an unknown unit exits 1 naming it, `service
  status` with no name says what it found, and `hosts check` shows ct129's dead GPU1 as dead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

pytestmark = pytest.mark.lab
VENVS = ("/root/venv", "/root/venv_sglang", "/root/venv_sglang211")


def cli(hosts: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts),
                           *args], capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "COLUMNS": "250", "NO_COLOR": "1"})


def sh(lab: Config, host: str, script: str, *args: str) -> str:
    with open_transport(lab, host) as t:
        r = t.run(Command.shell(script, *args), timeout=120)
    assert r.ok, f"{script}: {r.stderr}"
    return r.stdout


# Every path under each declared venv with its type, size and mtime; "missing" for one that
# is not there (the listing of a venv is the evidence that a read left it as it was).
SNAPSHOT = r"""
for v in "$@"; do
  if [ -e "$v" ]; then find "$v" -printf '%p %y %s %T@\n' | sort; else echo "missing $v"; fi
done
"""


def test_overlay_history_writes_nothing_in_declared_venvs(lab: Config) -> None:
    before = sh(lab, "ct200", SNAPSHOT, *VENVS)
    r = cli(lab.path, "overlay", "history", "ct200", "--json")
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)["results"]) == set(VENVS)
    assert sh(lab, "ct200", SNAPSHOT, *VENVS) == before


def test_plan_shows_the_reachable_host_beside_an_unreachable_one(lab: Config,
                                                                 tmp_path: Path) -> None:
    text = lab.path.read_text()
    head, sep, tail = text.partition("\ndeployments:")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(head.rstrip("\n") + "\n  gone:\n    address: 127.0.0.1\n    port: 1\n"
                     "    ssh_persist: 0\n    connect_timeout: 5\n" + sep + tail)
    r = cli(hosts, "plan", "ct200", "gone", "--json", "--refresh")
    assert r.returncode == 3, r.stdout + r.stderr
    doc = json.loads(r.stdout)["results"]  # docs/json.md
    assert set(doc["errors"]) == {"gone"}
    assert {s["host"] for s in doc["steps"]} == {"ct200"} and doc["fingerprints"]["ct200"]


def test_service_commands_say_what_they_found(lab: Config) -> None:
    down = cli(lab.path, "service", "down", "ct200", "nosuch-operator-test")
    assert down.returncode == 1, down.stdout + down.stderr
    assert "nosuch-operator-test.service: no such ddtree-deploy service on ct200" in down.stderr
    status = cli(lab.path, "service", "status", "ct200")
    assert status.returncode in (0, 1), status.stderr
    assert status.stdout.strip(), "service status printed nothing"
    listed = cli(lab.path, "service", "list", "ct200", "--json")
    assert listed.returncode == 0, listed.stderr
    assert all(u["unit"] != "qwen-wrapper.service" for u in json.loads(listed.stdout)["results"])


def test_hosts_check_shows_the_dead_gpu(lab: Config) -> None:
    r = cli(lab.path, "hosts", "check", "ct129")
    assert r.returncode == 0, r.stderr
    assert "GPU1: DEAD (Unknown Error)" in r.stdout and " GPU0: " in r.stdout, r.stdout


KEY = "sk-lab-operator-5b7e21"  # made up: looked for everywhere it must not be
TOKEN = "hf_labOperatorToken77"
KEYED = """
  keyed-operator:
    host: ct129
    venv: ml-env
    cuda_lane: cu130
    sglang:
      version: 0.5.11
    payload: false
    gpu: 0
    port: 30077
    algorithm: dflash
    draft_model_path: /dev/shm/Qwen3.6-27B-DFlash-b16
    bind: 127.0.0.1
    api_key_file: {key}
    hf_token_file: {token}
"""


def test_secrets_reach_the_server_and_nothing_else(lab: Config, tmp_path: Path) -> None:
    """Item 6 on real systemd: the key in a 0600 --config file and HF_TOKEN in a 0600
    EnvironmentFile; neither in the unit, /proc/PID/cmdline, the journal or the CLI's
    output; the service's own environment has HF_TOKEN; the probe gets through."""
    (tmp_path / "key").write_text(KEY + "\n")
    (tmp_path / "token").write_text(TOKEN + "\n")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(lab.path.read_text().rstrip("\n") + "\n" + KEYED.format(
        key=tmp_path / "key", token=tmp_path / "token"))
    base = "/etc/ddtree-deploy/services/keyed-operator"
    try:
        up = cli(hosts, "service", "up", "ct129", "keyed-operator", "--deadline", "120")
        assert up.returncode == 0, up.stdout + up.stderr
        unit = sh(lab, "ct129", "cat /etc/systemd/system/keyed-operator.service")
        assert f"EnvironmentFile={base}/environment" in unit
        assert f"--config {base}/server.yaml" in unit and f"{base}/serve.py" in unit
        assert "--host 127.0.0.1" in unit
        modes = sh(lab, "ct129", f"stat -c '%a %U %n' {base}/server.yaml {base}/environment")
        assert modes.split("\n")[:2] == [f"600 root {base}/server.yaml",
                                         f"600 root {base}/environment"], modes
        pid = sh(lab, "ct129", "systemctl show -p MainPID --value keyed-operator").strip()
        cmdline = sh(lab, "ct129", f"tr '\\0' ' ' < /proc/{pid}/cmdline")
        environ = sh(lab, "ct129", f"tr '\\0' '\\n' < /proc/{pid}/environ")
        journal = sh(lab, "ct129", "journalctl -u keyed-operator --no-pager -o cat")
        shown = sh(lab, "ct129", "systemctl show keyed-operator")
        probe = cli(hosts, "probe", "ct129", "keyed-operator", "--json")
        assert probe.returncode == 0, probe.stdout + probe.stderr
        assert "--config" in cmdline and f"HF_TOKEN={TOKEN}" in environ.splitlines()
        # apply with all it can show (-vv: every command and every line it printed, the
        # failed command's whole stderr) and its run log (issue 31): never the secrets. Its
        # outcome is not what this asks (a refusal would still have gathered and printed).
        applied = cli(hosts, "apply", "ct129", "--yes", "-vv", timeout=900)
        said = applied.stdout + applied.stderr
        logged = [ln.split(" run log ", 1)[1] for ln in applied.stderr.splitlines()
                  if ln.startswith("ct129: run log ")]
        assert len(logged) == 1, said
        runlog = Path(logged[0]).read_text()
        assert "ct129:   out| " in said and '"event": "command"' in runlog, said
        for where, text in (("unit", unit), ("cmdline", cmdline), ("journal", journal),
                            ("systemctl show", shown), ("service up", up.stdout + up.stderr),
                            ("probe", probe.stdout + probe.stderr), ("apply -vv", said),
                            ("run log", runlog)):
            assert KEY not in text and TOKEN not in text, where
    finally:
        cli(hosts, "service", "down", "ct129", "keyed-operator", "--remove")
    assert sh(lab, "ct129", f"test -e {base} && echo left || echo gone").strip() == "gone"
