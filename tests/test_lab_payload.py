"""The payload round trip in the lab: deploy on ct129's ml-env, a DDTREE service runs, rollback
restores the upstream files and DDTREE is refused again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

pytestmark = pytest.mark.lab
ML_ENV = "/root/ml-env"
PKG = f"{ML_ENV}/lib/python3.11/site-packages/sglang"


def cli(lab: Config, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(lab.path),
                           *args], capture_output=True, text=True, timeout=180, check=False)


def package_hashes(lab: Config) -> str:
    with open_transport(lab, "ct129") as t:
        r = t.run(Command.shell('cd "$1" && find . -name "*.py" -not -path "*/__pycache__/*" '
                                '| sort | xargs sha256sum', PKG), timeout=60)
    assert r.ok, r.stderr
    return r.stdout


def start_ddtree(lab: Config) -> subprocess.CompletedProcess[str]:
    return cli(lab, "service", "up", "ct129", "--name", "ddtree-lab", "--gpu", "0", "--venv",
               ML_ENV, "--algorithm", "ddtree", "--ddtree-budget", "15", "--ddtree-topk", "8",
               "--attention-backend", "triton", "--grammar-backend", "none", "--deadline", "60")


def test_payload_deploy_then_ddtree_serves_then_rollback_refuses(lab: Config) -> None:
    before = package_hashes(lab)
    try:
        r = cli(lab, "payload", "deploy", "ct129", "--venv", ML_ENV, "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["action"] == "deployed" and report["sglang"] == "0.5.11"
        checks = {c["name"]: c for c in report["checks"]}
        assert checks["spec_info"]["status"] == "passed"
        assert '"ddtree": true' in checks["spec_info"]["detail"]
        assert '"dflash": true' in checks["spec_info"]["detail"]
        # the lab's stand-in torch is not the full stack: the normal import is skipped, and said
        assert all(c["status"] == "skipped" for c in checks.values() if c["mode"] == "full")
        status = json.loads(cli(lab, "payload", "status", "ct129", "--json").stdout)
        assert status[ML_ENV]["version"] == report["payload"]
        up = start_ddtree(lab)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "healthy" in up.stdout
        unit = cli(lab, "service", "logs", "ct129", "ddtree-lab").stdout
        assert "width 25600" in unit  # DDTree counts as DFlash: the draft gets 5 x 5120
    finally:
        cli(lab, "service", "down", "ct129", "ddtree-lab", "--remove")
        back = cli(lab, "payload", "rollback", "ct129", "--venv", ML_ENV, "--json")
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout)["action"] == "rolled back"
    assert package_hashes(lab) == before
    refused = start_ddtree(lab)
    cli(lab, "service", "down", "ct129", "ddtree-lab", "--remove")
    assert refused.returncode == 1
    assert "invalid choice: 'DDTREE'" in refused.stdout
