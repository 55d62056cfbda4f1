"""The embedded lab hosts file is never a silent default (issue 30, item 8).

Found rather than named, the hosts file in use is said on stderr; `apply` on the embedded
default (no --hosts, $DDTREE_DEPLOY_HOSTS, ./hosts.yaml or XDG file) is refused with exit 2
before any host is contacted, unless the lab is asked for with `--lab`. A checkout's
./hosts.yaml is a user's file: scripts/demo.sh's `apply ct200 --yes`, run from the checkout's
root, is not refused. (Past the refusal, apply is stopped by a missing --plan file here, so
that no host is ever contacted.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli.app import build_app
from ddtree_deploy.errors import UsageError
from ddtree_deploy.resources import embedded_hosts_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DDTREE_DEPLOY_HOSTS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path


def run(*args: str) -> tuple[int, str, str, BaseException | None]:
    result = CliRunner().invoke(build_app(list(args)), list(args))
    exc = result.exception if not isinstance(result.exception, SystemExit) else None
    code = int(getattr(exc, "exit_code", 1)) if exc is not None else result.exit_code
    return code, result.stdout, result.stderr, exc


def test_the_embedded_default_is_named(elsewhere: Path) -> None:
    code, out, err, _ = run("hosts", "list")
    assert code == 0, out + err
    assert f"hosts file: {embedded_hosts_file()} (the embedded lab file" in err
    assert "apply on it needs --lab" in err


def test_apply_on_the_embedded_default_is_refused(elsewhere: Path) -> None:
    code, out, err, exc = run("apply", "ct200", "--yes")
    assert isinstance(exc, UsageError) and code == 2
    assert "embedded default" in str(exc) and "--lab apply" in str(exc)


def test_apply_with_lab_asked_for_goes_on(elsewhere: Path) -> None:
    code, out, err, exc = run("--lab", "apply", "ct200", "--yes", "--plan", "missing.json")
    assert exc is not None and "missing.json" in str(exc) and "embedded" not in str(exc)
    assert "hosts file:" not in err  # named on purpose: nothing to say
    code, out, err, exc = run("--lab", "--hosts", str(embedded_hosts_file()), "hosts", "list")
    assert isinstance(exc, UsageError) and "--lab and --hosts" in str(exc)


def test_a_checkouts_hosts_yaml_is_a_users_file(elsewhere: Path) -> None:
    """As scripts/demo.sh runs it: from the folder that holds hosts.yaml."""
    assert "$dd apply ct200 --yes" in (ROOT / "scripts" / "demo.sh").read_text()
    assert 'cd "$(dirname "$0")/.."' in (ROOT / "scripts" / "demo.sh").read_text()
    shutil.copy(ROOT / "hosts.yaml", elsewhere / "hosts.yaml")
    code, out, err, exc = run("apply", "ct200", "--yes", "--plan", "missing.json")
    assert exc is not None and "missing.json" in str(exc) and "embedded" not in str(exc)
    assert "hosts file: hosts.yaml (./hosts.yaml of this folder)" in err
