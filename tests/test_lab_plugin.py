"""The plugin form in the lab (issue 27): the story's deployment moved from sglang 0.5.11 to
0.5.17 by changing `sglang.version` in hosts.yaml.

On a fresh lab: plan refuses while hosts.yaml still pins 0.5.11's flashinfer (naming the pin and
0.5.17's own, exit 2); with the pin fixed, plan shows sglang==0.5.17 and the DDTree plugin and
apply converges: sglang 0.5.17 from the registry (--no-deps), flashinfer 0.6.15.post1 with its
dependencies, the plugin wheel installed with uv (pushed), nothing written into the sglang
package, the unit starting `--speculative-algorithm DDTREE` with the SGLANG_DDTREE_* settings,
the stand-in server finding the plugin's entry point, the probe healthy; a second plan reports
no changes; payload rollback leaves sglang byte-identical and the entry point gone. What the
lab stands in for: torch, sglang-kernel and the GPUs (the real plugin cannot run on the stand-in
torch; its entry point's presence stands for its registration).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ddtree_deploy.config.hosts import Config, load_config
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

pytestmark = pytest.mark.lab
VENV = "/root/venv_sglang211"


def cli(path: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(path),
                           *args], capture_output=True, text=True, timeout=timeout, check=False)


def sh(lab: Config, script: str, *args: str) -> str:
    with open_transport(lab, "ct200") as t:
        r = t.run(Command.shell(script, *args), timeout=300)
    assert r.ok, r.stderr
    return r.stdout


def hosts_0517(tmp_path: Path, extra: list[str]) -> Path:
    doc = yaml.safe_load(embedded_hosts_file().read_text())
    doc["deployments"]["sglang-ddtree"]["sglang"] = {"version": "0.5.17", "extra_packages": extra}
    path = tmp_path / "hosts-0517.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def pending(plan_json: str) -> list[tuple[str, str]]:
    return [(s["kind"], s["title"]) for s in json.loads(plan_json)["results"]["steps"]
            if not s["satisfied"] and s["kind"] != "service.probe"]


@pytest.fixture(scope="module")
def fresh(lab_session: None) -> Iterator[Config]:
    from ddtree_lab import manager

    manager.up()
    yield load_config(embedded_hosts_file())
    manager.up()


def test_a_0517_deployment_is_planned_applied_and_probed_with_the_plugin(
        fresh: Config, tmp_path: Path) -> None:
    stale = hosts_0517(tmp_path, ["soundfile==0.13.1", "flashinfer-python==0.6.8.post1"])
    refused = cli(stale, "plan", "ct200", "--refresh")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "flashinfer-python==0.6.8.post1: sglang 0.5.17 requires " \
           "flashinfer_python[cu13]==0.6.15.post1" in refused.stderr

    hosts = hosts_0517(tmp_path, ["soundfile==0.13.1", "flashinfer-python==0.6.15.post1"])
    first = cli(hosts, "plan", "ct200", "--json", "--refresh")
    assert first.returncode == 4, first.stderr
    steps = pending(first.stdout)
    assert ("package.install", "sglang==0.5.17") in steps
    assert ("payload.deploy", "DDTree plugin") in steps

    applied = cli(hosts, "apply", "ct200", "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    unit = sh(fresh, "cat /etc/systemd/system/sglang-ddtree.service")
    assert "--speculative-algorithm DDTREE" in unit and "SGLANG_DDTREE_BUDGET=15" in unit
    assert "--speculative-ddtree-budget" not in unit
    state = json.loads(sh(fresh, f"cat {VENV}/.ddtree-deploy/payload.json"))
    assert state["form"] == "plugin" and state["sglang"] == "0.5.17"
    eps = sh(fresh, f"{VENV}/bin/python -I -c 'from importlib.metadata import entry_points; "
                    "print(sorted(e.name for e in entry_points(group=\"sglang.srt.plugins\")))'")
    assert eps.strip() == "['ddtree']"
    logs = cli(hosts, "service", "logs", "ct200", "sglang-ddtree").stdout
    assert "registered speculative algorithm DDTREE" in logs
    probe = cli(hosts, "probe", "ct200", "sglang-ddtree", "--json")
    assert probe.returncode == 0, probe.stdout + probe.stderr

    again = cli(hosts, "plan", "ct200", "--json", "--refresh")
    assert again.returncode == 0, pending(again.stdout)

    verified = cli(hosts, "payload", "verify", "ct200", "--venv", VENV, "--json")
    checks = {c["name"]: c["status"] for c in json.loads(verified.stdout)["results"]["checks"]}
    assert checks["files"] == "passed" and checks["plugin"] == "passed", verified.stdout
    assert checks["sglang_untouched"] == "passed", "the sglang package was written into"
    assert checks.get("plugin_import") == "skipped"  # the lab's torch is a stand-in
    cli(hosts, "service", "down", "ct200", "sglang-ddtree")
    back = cli(hosts, "payload", "rollback", "ct200", "--venv", VENV, "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    assert json.loads(back.stdout)["results"]["action"] == "rolled back"
    eps = sh(fresh, f"{VENV}/bin/python -I -c 'from importlib.metadata import entry_points; "
                    "print(sorted(e.name for e in entry_points(group=\"sglang.srt.plugins\")))'")
    assert eps.strip() == "[]"
