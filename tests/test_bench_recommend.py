"""bench recommend --write: the choice goes into hosts.yaml with a diff, comments kept;
the embedded default and values from anchors or merge keys are refused (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.bench.recommend import recommend
from ddtree_deploy.bench.results import Results
from ddtree_deploy.bench.summary import fold
from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.resources import embedded_hosts_file

RECORDED = Path(__file__).parent / "data" / "bench" / "standin-sweep.json"
HOSTS = """\
# my hosts (this comment stays)
version: 1
hosts:
  gpu1:
    address: 10.0.0.5   # the box
    venvs:
      serve: {path: /opt/v, role: serving}
deployments:
  svc:                  # the service
    host: gpu1
    venv: serve
    cuda_lane: cu130
    sglang: {version: 0.5.11}
    algorithm: dflash   # for now
    model_path: /m/t
    draft_model_path: /m/d
    port: 30001
  base: &base
    host: gpu1
    venv: serve
    cuda_lane: cu130
    sglang: {version: 0.5.11}
    algorithm: dflash
    model_path: /m/t
    draft_model_path: /m/d
    port: 30002
  twin:
    <<: *base
    port: 30003
  tree:
    host: gpu1
    venv: serve
    cuda_lane: cu130
    sglang: {version: 0.5.11}
    algorithm: ddtree
    ddtree: &shared {budget: 63, topk: 4}
    model_path: /m/t
    draft_model_path: /m/d
    port: 30004
"""


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture()
def hosts(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(HOSTS)
    load_config(path)  # a valid hosts file to begin with
    return path


def test_write_shows_the_diff_keeps_comments_and_stays_valid(hosts: Path) -> None:
    best = recommend(fold(Results.load(RECORDED)))["overall"]
    assert best is not None and best.algorithm == "ddtree"
    out = _cli("--hosts", str(hosts), "bench", "recommend", "--results", str(RECORDED),
               "--write", "svc", "--yes", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)["results"]  # docs/json.md
    assert data["write"]["written"] is True
    assert "-    algorithm: dflash   # for now" in data["write"]["diff"]
    assert "+    algorithm: ddtree   # for now" in data["write"]["diff"]
    text = hosts.read_text()
    old, new = HOSTS.splitlines(), text.splitlines()
    assert [ln for ln in old if ln not in new] == ["    algorithm: dflash   # for now"]
    assert "# my hosts (this comment stays)" in text and "  svc:                  # the service" \
        in text
    dep = load_config(hosts).deployment("svc")
    assert dep.algorithm == "ddtree" and dep.ddtree is not None
    assert (dep.ddtree.budget, dep.ddtree.topk, dep.ddtree.shadow_linear) == \
        (best.budget, best.topk, best.shadow_linear)
    again = _cli("--hosts", str(hosts), "bench", "recommend", "--results", str(RECORDED),
                 "--write", "svc", "--yes")
    assert again.returncode == 0 and "already has this configuration" in again.stderr
    assert hosts.read_text() == text


def test_without_a_terminal_or_yes_nothing_is_written(hosts: Path) -> None:
    out = _cli("--hosts", str(hosts), "bench", "recommend", "--results", str(RECORDED),
               "--write", "svc", stdin="y\n")
    assert out.returncode == 2 and "pass --yes" in out.stderr
    assert "+    algorithm: ddtree" in out.stderr  # the diff is shown first
    assert hosts.read_text() == HOSTS


@pytest.mark.parametrize(("deployment", "message"), [
    ("base", "hosts.yaml:18: deployments.base: the deployment is an anchor"),
    ("twin", "hosts.yaml:27: deployments.twin.algorithm: the value comes from a merge key"),
    ("tree", "deployments.tree.ddtree: the value is an anchor"),
    ("nope", "no deployment 'nope'"),
])
def test_anchored_values_are_refused(hosts: Path, deployment: str, message: str) -> None:
    out = _cli("--hosts", str(hosts), "bench", "recommend", "--results", str(RECORDED),
               "--write", deployment, "--yes")
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert hosts.read_text() == HOSTS


def test_the_embedded_default_is_never_edited() -> None:
    embedded = embedded_hosts_file()
    before = embedded.read_bytes()
    name = next(iter(load_config(embedded).deployments))
    out = _cli("--hosts", str(embedded), "bench", "recommend", "--results", str(RECORDED),
               "--write", name, "--yes")
    assert out.returncode == 2 and "embedded default hosts file" in out.stderr
    assert embedded.read_bytes() == before
