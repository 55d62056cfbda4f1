"""The payload round trip in the lab: deploy on ct129's ml-env, a DDTREE service runs, rollback
restores the upstream files and DDTREE is refused again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

pytestmark = pytest.mark.lab
ML_ENV = "/root/ml-env"
PKG = f"{ML_ENV}/lib/python3.11/site-packages/sglang"


def writable(lab: Config, folder: Path) -> Path:
    """The lab's hosts file with ml-env open to the tool's writes: ml-env is a `source` venv,
    which the tool refuses to write into unless it says `allow_writes: true` (issue 30)."""
    text = lab.path.read_text(encoding="utf-8")
    marker = f"path: {ML_ENV}\n        role: source"
    assert marker in text, "the lab's ml-env is no longer declared as the test expects"
    path = folder / "hosts.yaml"
    path.write_text(text.replace(marker, marker + "\n        allow_writes: true"), encoding="utf-8")
    return path


def cli(hosts: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts),
                           *args], capture_output=True, text=True, timeout=180, check=False)


def package_hashes(lab: Config) -> str:
    with open_transport(lab, "ct129") as t:
        r = t.run(Command.shell('cd "$1" && find . -name "*.py" -not -path "*/__pycache__/*" '
                                '| sort | xargs sha256sum', PKG), timeout=60)
    assert r.ok, r.stderr
    return r.stdout


def start_ddtree(hosts: Path) -> subprocess.CompletedProcess[str]:
    return cli(hosts, "service", "up", "ct129", "--name", "ddtree-lab", "--gpu", "0", "--venv",
               ML_ENV, "--algorithm", "ddtree", "--ddtree-budget", "15", "--ddtree-topk", "8",
               "--attention-backend", "triton", "--grammar-backend", "none", "--deadline", "60")


def test_payload_deploy_then_ddtree_serves_then_rollback_refuses(lab: Config,
                                                                  tmp_path: Path) -> None:
    hosts = writable(lab, tmp_path)
    before = package_hashes(lab)
    try:
        r = cli(hosts, "payload", "deploy", "ct129", "--venv", ML_ENV, "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)["results"]  # docs/json.md
        assert report["action"] == "deployed" and report["sglang"] == "0.5.11"
        checks = {c["name"]: c for c in report["checks"]}
        assert checks["spec_info"]["status"] == "passed"
        assert '"ddtree": true' in checks["spec_info"]["detail"]
        assert '"dflash": true' in checks["spec_info"]["detail"]
        # the lab's stand-in torch is not the full stack: the normal import is skipped, and said
        assert all(c["status"] == "skipped" for c in checks.values() if c["mode"] == "full")
        status = json.loads(cli(hosts, "payload", "status", "ct129", "--json").stdout)["results"]
        assert status[ML_ENV]["version"] == report["payload"]
        up = start_ddtree(hosts)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "healthy" in up.stdout
        unit = cli(hosts, "service", "logs", "ct129", "ddtree-lab").stdout
        assert "width 25600" in unit  # DDTree counts as DFlash: the draft gets 5 x 5120
    finally:
        cli(hosts, "service", "down", "ct129", "ddtree-lab", "--remove")
        back = cli(hosts, "payload", "rollback", "ct129", "--venv", ML_ENV, "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["results"]["action"] == "rolled back"
    assert package_hashes(lab) == before
    refused = start_ddtree(hosts)
    cli(hosts, "service", "down", "ct129", "ddtree-lab", "--remove")
    assert refused.returncode == 1
    assert "invalid choice: 'DDTREE'" in refused.stdout
