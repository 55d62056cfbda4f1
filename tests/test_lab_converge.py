"""plan and apply, end to end on a fresh lab: the story's deployment on ct200 from nothing."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree_deploy.config.hosts import Config, load_config
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

pytestmark = pytest.mark.lab
VENV = "/root/venv_sglang211"


def cli(config: Config | Path, *args: str, timeout: float = 900
        ) -> subprocess.CompletedProcess[str]:
    path = config.path if isinstance(config, Config) else config
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(path), *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def sh(lab: Config, script: str, *args: str) -> str:
    with open_transport(lab, "ct200") as t:
        r = t.run(Command.shell(script, *args), timeout=120)
    assert r.ok, r.stderr
    return r.stdout


def pending(plan_json: str) -> list[tuple[str, str]]:
    return [(s["kind"], s["title"]) for s in json.loads(plan_json)["results"]["steps"]
            if not s["satisfied"] and s["kind"] != "service.probe"]


@pytest.fixture(scope="module")
def fresh(lab_session: None) -> Iterator[Config]:
    from ddtree_lab import manager

    manager.up()  # a fresh lab: nothing of the deployment exists on ct200
    yield load_config(embedded_hosts_file())
    manager.up()  # and a fresh one again for the tests after these (GPU1 was taken here)


def test_plan_apply_converge(fresh: Config, tmp_path: Path) -> None:
    lab = fresh
    first = cli(lab, "plan", "ct200", "--json", "--refresh")
    assert first.returncode == 4, first.stderr
    kinds = [k for k, _ in pending(first.stdout)]
    for kind in ("venv.create", "lane.overlay", "package.install", "payload.deploy",
                 "unit.install", "service.start"):
        assert kind in kinds, (kind, kinds)
    titles = [t for _, t in pending(first.stdout)]
    assert "sglang==0.5.11" in titles and "soundfile==0.13.1" in titles

    applied = cli(lab, "apply", "ct200", "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "converged" in applied.stdout
    # the run log (issue 31): said on stderr, 0600, every step and command with exit and seconds
    logged = [line.split(" run log ", 1)[1] for line in applied.stderr.splitlines()
              if line.startswith("ct200: run log ")]
    assert len(logged) == 1, applied.stderr
    log = Path(logged[0])
    assert log.stat().st_mode & 0o777 == 0o600
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[0]["event"] == "start" and events[0]["what"]["hosts"] == ["ct200"]
    assert events[-1]["event"] == "end" and events[-1]["ok"] is True
    steps = {e["kind"] for e in events if e["event"] == "step" and e["ok"]}
    assert {"payload.deploy", "unit.install", "service.start"} <= steps, steps
    assert any(e["event"] == "command" and e["exit"] == 0 and e["seconds"] >= 0
               for e in events)
    # progress (issue 31): each step said as it ends with its seconds, plain (a pipe: no bars,
    # no control codes); the summary gives each step's seconds and the total
    for kind in ("lane.overlay", "package.install", "service.probe"):
        assert re.search(rf"^ct200: {re.escape(kind)} .* done in [0-9.hm]+s$",
                         applied.stderr, re.M), (kind, applied.stderr)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", applied.stdout + applied.stderr)
    assert re.search(r"^ +[0-9.hm]+s +lane\.overlay +CUDA lane", applied.stdout, re.M)
    assert re.search(r"^ +[0-9.hm]+s +in all$", applied.stdout, re.M), applied.stdout
    unit = sh(lab, "cat /etc/systemd/system/sglang-ddtree.service")
    for line in ("CUDA_VISIBLE_DEVICES=1", "--port 30001", "--speculative-algorithm DDTREE",
                 "--speculative-ddtree-budget 15", "--speculative-ddtree-topk 8",
                 "--attention-backend triton", "--grammar-backend none", "nvidia/cu13/lib"):
        assert line in unit, line
    assert sh(lab, "systemctl is-active qwen-wrapper").strip() == "active"
    pid = sh(lab, "systemctl show -p MainPID --value sglang-ddtree").strip()
    apps = sh(lab, "nvidia-smi --query-compute-apps=pid --format=csv,noheader").split()
    assert pid in apps and len(apps) == 2

    again = cli(lab, "plan", "ct200", "--json", "--refresh")
    assert again.returncode == 0, pending(again.stdout)
    saved = tmp_path / "plan.json"
    assert cli(lab, "plan", "ct200", "--out", str(saved)).returncode == 0

    sh(lab, f"{VENV}/bin/python -m pip uninstall -q -y soundfile")
    one = cli(lab, "plan", "ct200", "--json", "--refresh")
    assert one.returncode == 4
    assert pending(one.stdout) == [("package.install", "soundfile==0.13.1")]
    refused = cli(lab, "apply", "--plan", str(saved), "--yes")
    assert refused.returncode == 1 and "facts changed" in refused.stdout + refused.stderr

    # Kill apply at a random point, then re-run: it converges.
    rng = random.Random(1129)
    proc = subprocess.Popen([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                             str(lab.path), "apply", "ct200", "--yes"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(rng.uniform(0.5, 3.0))
    if proc.poll() is None:
        import os

        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = cli(lab, "apply", "ct200", "--yes", "-vv")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # -vv: each command and, line by line, what it printed
    assert re.search(r"^ct200: \$ \S", resumed.stderr, re.M), resumed.stderr
    assert re.search(r"^ct200: .*\(exit 0, [0-9.]+s\)$", resumed.stderr, re.M)
    assert re.search(r"^ct200:   (out|err)\| ", resumed.stderr, re.M), resumed.stderr
    assert cli(lab, "plan", "ct200", "--refresh").returncode == 0

    # Without a terminal and without --yes, apply refuses; a second apply is refused by the lock.
    no_tty = cli(lab, "apply", "ct200")
    assert no_tty.returncode == 2 and "--yes" in no_tty.stderr
    from ddtree_deploy.converge.lock import HostLock
    from ddtree_deploy.transport.connect import open_transport

    with open_transport(lab, "ct200") as t, HostLock(t, lab.host("ct200")) as held:
        busy = cli(lab, "apply", "ct200", "--yes")
    assert busy.returncode == 1
    assert "another apply holds ct200" in busy.stdout and held.holder in busy.stdout

    # A deployment removed from hosts.yaml: plan removes its unit (and only its unit).
    text = Path(lab.path).read_text()
    without = tmp_path / "hosts.yaml"
    without.write_text(text.split("\ndeployments:")[0] + "\n")
    removal = cli(without, "plan", "ct200", "--json")
    assert removal.returncode == 4
    assert pending(removal.stdout) == [("unit.remove", "sglang-ddtree.service")]


def test_an_older_payload_is_upgraded_in_place_by_apply(fresh: Config, tmp_path: Path) -> None:
    """Issue 12, deliverable 6: a host whose venv holds an older payload variant is upgraded in
    place by plan/apply (under the lock, with a restart), not refused."""
    import shutil

    from ddtree_deploy.payload.manifest import load_manifest
    from ddtree_deploy.resources import data_path

    lab = fresh
    converged = cli(lab, "apply", "ct200", "--yes")  # the test before leaves it so; alone too
    assert converged.returncode == 0, converged.stdout + converged.stderr
    shipped, _ = load_manifest(data_path("payload"))
    older = tmp_path / "older-payload"
    shutil.copytree(data_path("payload"), older)
    text = (older / "payload.yaml").read_text()
    (older / "payload.yaml").write_text(
        text.replace(f'version: "{shipped.version}"', 'version: "0.0.9-older"', 1))
    core = older / "ddtree/core.py"
    core.write_text(core.read_text() + "\n# the older variant\n")
    down = cli(lab, "payload", "deploy", "ct200", "--venv", VENV, "--payload", str(older),
               "--json")
    assert down.returncode == 0, down.stdout + down.stderr
    # from the shipped one, in place
    assert json.loads(down.stdout)["results"]["action"] == "upgraded"
    pid = sh(lab, "systemctl show -p MainPID --value sglang-ddtree").strip()

    plan = cli(lab, "plan", "ct200", "--json", "--refresh")
    assert plan.returncode == 4, plan.stdout + plan.stderr
    assert pending(plan.stdout) == [("payload.upgrade", "DDTree payload"),
                                    ("unit.install", "sglang-ddtree.service"),
                                    ("service.start", "sglang-ddtree.service")]
    step = next(s for s in json.loads(plan.stdout)["results"]["steps"]
                if s["kind"] == "payload.upgrade")
    assert step["reason"] == (f"payload ddtree 0.0.9-older is installed; this tool ships "
                              f"ddtree {shipped.version}")

    applied = cli(lab, "apply", "ct200", "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "payload.upgrade" in applied.stdout and "converged" in applied.stdout
    status = json.loads(cli(lab, "payload", "status", "ct200", "--json").stdout)["results"]
    assert status[VENV]["version"] == shipped.version
    assert sh(lab, "systemctl is-active sglang-ddtree").strip() == "active"
    assert sh(lab, "systemctl show -p MainPID --value sglang-ddtree").strip() != pid  # restarted
    again = cli(lab, "plan", "ct200", "--json", "--refresh")
    assert again.returncode == 0, pending(again.stdout)
