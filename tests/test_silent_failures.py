"""Silent failures and stale views (issue 30, item 7): what went wrong is said, never shown
as "nothing".

Pure parts (unit): a dead GPU in `hosts check` (the stand-in nvidia-smi's CSV for ct129's
GPU1), a GPU-less host, facts whose systemctl part failed (doctor and inventory), unknown
names with a suggestion and localhost listed once. The service commands (integration) run
against this machine's real systemctl, which fails here without systemd (a fake one on PATH
says so where the machine has systemd), and a fake systemctl that answers.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from ddtree_deploy.cli.render_inventory import part_errors
from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.errors import ConfigError, RefusedError
from ddtree_deploy.facts.model import Facts, NvidiaInfo, Services
from ddtree_deploy.hostcheck import parse
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.rules import diagnose
from ddtree_deploy.service.resolve import choose_gpu
from ddtree_deploy.transport.fanout import Outcome

NO_SYSTEMD = "System has not been booted with systemd as init system (PID 1). Can't operate."


def test_hosts_check_shows_a_dead_gpu_as_dead() -> None:
    text = ("@hostname\nct129\n@kernel\n6.1\n@gpus\n"
            "0, NVIDIA RTX A6000, 1, 49140, 31, P8\n"
            "1, NVIDIA RTX A6000, 0, 49140, [Unknown Error], [Unknown Error]\n"
            "2, NVIDIA RTX A6000, 0, 49140, [N/A], P0\n@venvs\n")
    check = parse("ct129", text)
    assert [g.memory for g in check.gpus] == ["1/49140", "DEAD (Unknown Error)", "0/49140"]


def test_a_gpu_less_host_is_told_so() -> None:
    facts = Facts(host="cpu", nvidia=NvidiaInfo(present=False,
                                                error="libnvidia-ml.so.1: not found"))
    with pytest.raises(RefusedError, match="cpu has no GPU: no NVIDIA driver answered"):
        choose_gpu(facts, None, own_unit="x.service")
    busy = Facts.model_validate({"host": "h", "nvidia": {"present": True, "gpus": [
        {"index": 0, "dead": True, "error": "gone"},
        {"index": 1, "processes": [{"pid": 7, "name": "python3"}]}]}})
    with pytest.raises(RefusedError, match=r"GPU 0 is dead \(gone\); GPU 1 is busy"):
        choose_gpu(busy, None, own_unit="x.service")


def test_a_failing_systemctl_shows_in_doctor_and_inventory() -> None:
    facts = Facts(host="h", services=Services(error=f"systemctl show: {NO_SYSTEMD}"))
    (finding,) = [f for f in diagnose(facts) if f.id == "host.units-unreadable"]
    assert finding.severity == "warning" and NO_SYSTEMD in finding.message
    buf = io.StringIO()
    con = Console(file=buf, width=80, color_system=None)
    for note in part_errors([Outcome("h", value=facts)]):
        con.print(note)
    assert "services could not be read" in buf.getvalue()
    assert "host.units-unreadable" not in [f.id for f in diagnose(Facts(host="h"))]


def test_unknown_names_get_a_suggestion_and_localhost_once(tmp_path: Path) -> None:
    config = load_config(embedded_hosts_file())
    with pytest.raises(ConfigError, match=r"unknown host 'ct20' \(did you mean 'ct200'"):
        config.host("ct20")
    with pytest.raises(ConfigError, match=r"did you mean 'sglang-ddtree'\?"):
        config.deployment("sglang-dtree")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("version: 1\nhosts:\n  localhost:\n    transport: local\n")
    with pytest.raises(ConfigError) as err:
        load_config(hosts).host("nope")
    assert str(err.value).count("localhost") == 1


def cli(root: Path, *args: str, fake: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_STATE_HOME=str(root / "state"), XDG_CACHE_HOME=str(root / "c"),
               NO_COLOR="1", COLUMNS="200", DDTREE_DEPLOY_HOSTS="")
    if fake is not None:  # a systemctl of our own, first on PATH
        bin_ = root / "bin"
        bin_.mkdir(exist_ok=True)
        (bin_ / "systemctl").write_text(f"#!/bin/sh\n{fake}\n")
        (bin_ / "systemctl").chmod(0o755)
        env["PATH"] = f"{bin_}:{env['PATH']}"
    (root / "hosts.yaml").write_text("version: 1\nhosts:\n  ws:\n    transport: local\n")
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                           str(root / "hosts.yaml"), *args], capture_output=True, text=True,
                          timeout=120, check=False, env=env, cwd=root)


FAILING = f'echo "{NO_SYSTEMD}" >&2; exit 1'
ANSWERING = 'case "$1" in show) echo Version=252;; *) exit 1;; esac'


@pytest.mark.integration
def test_service_list_says_systemctl_failed_not_no_services(tmp_path: Path) -> None:
    for what in ("list", "status"):
        ran = cli(tmp_path, "service", what, "ws", fake=FAILING)
        assert ran.returncode == 1, (what, ran.stdout, ran.stderr)
        assert "systemctl does not answer" in ran.stderr and NO_SYSTEMD in ran.stderr
        assert "no ddtree-deploy services" not in ran.stdout


@pytest.mark.integration
def test_service_status_and_down_say_what_they_found(tmp_path: Path) -> None:
    status = cli(tmp_path, "service", "status", "ws", fake=ANSWERING)
    assert status.returncode == 0, status.stderr
    assert "no ddtree-deploy services on ws" in status.stdout
    down = cli(tmp_path, "service", "down", "ws", "nosuch-ddtree-test", fake=ANSWERING)
    assert down.returncode == 1, down.stdout + down.stderr
    assert "nosuch-ddtree-test.service: no such ddtree-deploy service on ws" in down.stderr
