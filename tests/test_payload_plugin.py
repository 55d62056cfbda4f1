"""The plugin form on the REAL sglang wheels of every release it supports (0.5.17, 0.5.19,
0.5.21, 0.5.23; tests/wheels.toml), through the real CLI on
localhost: `payload deploy` builds the plugin wheel from payload/plugin/ and installs it with
uv (pushed into a scratch HOME from the uv wheel of tests/wheels.toml) or the venv's own pip;
verify, rollback; nothing written into the sglang package (its tree byte-identical after
deploy, verify and rollback); the venv lists the entry point after deploy and not after
rollback. A 0.5.11 venv with the patch set whose sglang is then reinstalled at 0.5.17 is moved
to the plugin in place, and back (the plugin uninstalled, the patch set deployed); a release
outside the matrix is refused with exit 2 and the list.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import wheelcache

from ddtree_deploy.converge.steps._install_uv import UV_VERSION

GROUP = "sglang.srt.plugins"
TIMEOUT_S = 600


def _pip_install(venv: Path, wheel: Path) -> None:
    """The venv's own pip installs WHEEL (offline, no dependencies), as a user would."""
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", "--no-compile", "--disable-pip-version-check", str(wheel)],
                   check=True)


def _venv(root: Path, name: str, wheel: Path, *, pip: bool = False) -> Path:
    venv = root / name
    subprocess.run([sys.executable, "-m", "venv", *([] if pip else ["--without-pip"]),
                    str(venv)], check=True)
    if pip:
        _pip_install(venv, wheel)
    else:
        site = next((venv / "lib").glob("python3.*/site-packages"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--no-compile", "--target", str(site), str(wheel)], check=True)
    return venv


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _sglang(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages")) / "sglang"


def _entry_points(venv: Path) -> list[str]:
    code = ("import json; from importlib.metadata import entry_points; "
            f"print(json.dumps(sorted(e.name for e in entry_points(group={GROUP!r}))))")
    out = subprocess.run([str(venv / "bin/python"), "-I", "-c", code], capture_output=True,
                         text=True, check=True).stdout
    return list(json.loads(out))


@pytest.fixture()
def world(tmp_path: Path) -> Path:
    """hosts.yaml, a scratch HOME (no uv on PATH) and XDG folders; the uv wheel where the
    workstation looks for it first."""
    (tmp_path / "hosts.yaml").write_text("version: 1\nhosts: {}\n")
    uv = tmp_path / "xdg/cache/ddtree-deploy/uv"
    uv.mkdir(parents=True)
    shutil.copy(wheelcache.wheel("uv", UV_VERSION), uv)
    (tmp_path / "home").mkdir()
    return tmp_path


def cli(root: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "xdg/cache"), HOME=str(root / "home"),
               XDG_STATE_HOME=str(root / "xdg/state"), XDG_CONFIG_HOME=str(root / "xdg/config"),
               PATH="/usr/bin:/bin", NO_COLOR="1", COLUMNS="200", **extra)
    try:
        return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                               str(root / "hosts.yaml"), "payload", *args],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                              env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"payload {' '.join(args)} did not finish in {TIMEOUT_S} s")


def _ok(r: subprocess.CompletedProcess[str]) -> str:
    said = r.stdout + r.stderr
    assert r.returncode == 0, said
    assert "Traceback" not in said
    return said


@pytest.mark.parametrize(("release", "installer"),
                         [("0.5.17", "uv"), ("0.5.17", "pip"), ("0.5.19", "uv"),
                          ("0.5.21", "uv"), ("0.5.23", "uv")])
def test_plugin_deploy_verify_rollback_leave_sglang_byte_identical(world: Path, release: str,
                                                                   installer: str) -> None:
    venv = _venv(world, f"v-{installer}", wheelcache.wheel("sglang", release),
                 pip=installer == "pip")
    before = _tree(_sglang(venv))
    assert _entry_points(venv) == []
    said = _ok(cli(world, "deploy", "localhost", "--venv", str(venv), "--installer", installer))
    assert f"deployed (sglang {release}, plugin" in said and f"installed with {installer}" in said
    assert _entry_points(venv) == ["ddtree"]
    assert _tree(_sglang(venv)) == before
    state = json.loads((venv / ".ddtree-deploy/payload.json").read_text())
    assert state["form"] == "plugin" and state["sglang"] == release and state["files"]
    r = cli(world, "verify", "localhost", "--venv", str(venv), "--json")
    _ok(r)
    checks = {c["name"]: c["status"] for c in json.loads(r.stdout)["results"]["checks"]}
    assert checks["files"] == "passed" and checks["plugin"] == "passed", r.stdout
    assert checks["sglang_untouched"] == "passed", r.stdout
    assert _tree(_sglang(venv)) == before
    again = _ok(cli(world, "deploy", "localhost", "--venv", str(venv)))
    assert "unchanged" in again
    _ok(cli(world, "rollback", "localhost", "--venv", str(venv)))
    assert _entry_points(venv) == []
    assert _tree(_sglang(venv)) == before
    assert not (venv / ".ddtree-deploy/payload.json").exists()
    site = _sglang(venv).parent
    assert not list(site.glob("ddtree*")), "the plugin's files stayed"


def test_where_uv_cannot_be_pushed_the_venvs_own_pip_installs_it(world: Path) -> None:
    """No uv on the host and none to push (the workstation has no uv wheel and no index):
    `--installer auto` falls back to the venv's own pip, saying why."""
    shutil.rmtree(world / "xdg/cache/ddtree-deploy/uv")
    venv = _venv(world, "v", wheelcache.wheel("sglang", "0.5.17"), pip=True)
    said = _ok(cli(world, "deploy", "localhost", "--venv", str(venv), PIP_NO_INDEX="1"))
    assert "installed with pip" in said, said
    assert _entry_points(venv) == ["ddtree"]
    assert not (world / "home/.ddtree-deploy/bin/uv").exists()
    r = cli(world, "deploy", "localhost", "--venv", str(venv), "--installer", "uv",
            PIP_NO_INDEX="1")
    assert r.returncode == 0 and "unchanged" in r.stdout, r.stdout + r.stderr


def test_a_changed_plugin_file_fails_verify(world: Path) -> None:
    venv = _venv(world, "v", wheelcache.wheel("sglang", "0.5.17"))
    _ok(cli(world, "deploy", "localhost", "--venv", str(venv)))
    site = _sglang(venv).parent
    (site / "ddtree_sglang/plugin.py").write_text("# changed by hand\n")
    r = cli(world, "verify", "localhost", "--venv", str(venv), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["results"]["checks"]}
    assert checks["files"]["status"] == "failed"
    assert "ddtree_sglang/plugin.py" in checks["files"]["detail"]


def test_a_patched_0511_venv_moves_to_the_plugin_when_its_sglang_becomes_0517(world: Path
                                                                               ) -> None:
    venv = _venv(world, "v", wheelcache.wheel("sglang", "0.5.11"), pip=True)
    fresh = _venv(world, "fresh", wheelcache.wheel("sglang", "0.5.17"), pip=True)
    said = _ok(cli(world, "deploy", "localhost", "--venv", str(venv)))
    assert "deployed (sglang 0.5.11, payload" in said
    added = sorted(p.name for p in (_sglang(venv) / "srt/speculative").glob("ddtree_*.py"))
    assert added, "the patch set adds modules"
    _pip_install(venv, wheelcache.wheel("sglang", "0.5.17"))
    leftover = sorted(p.name for p in (_sglang(venv) / "srt/speculative").glob("ddtree_*.py"))
    assert leftover == added, "pip leaves the files the patch set added"
    said = _ok(cli(world, "deploy", "localhost", "--venv", str(venv)))
    assert "retired" in said and "deployed (sglang 0.5.17, plugin" in said, said
    assert _tree(_sglang(venv)) == _tree(_sglang(fresh))
    assert not list((venv / ".ddtree-deploy/backups").iterdir())
    assert _entry_points(venv) == ["ddtree"]


def test_a_plugin_venv_goes_back_to_the_patch_set_when_its_sglang_becomes_0511(world: Path
                                                                            ) -> None:
    venv = _venv(world, "v", wheelcache.wheel("sglang", "0.5.17"), pip=True)
    fresh = _venv(world, "fresh", wheelcache.wheel("sglang", "0.5.11"), pip=True)
    said = _ok(cli(world, "deploy", "localhost", "--venv", str(venv)))
    assert "deployed (sglang 0.5.17, plugin" in said
    assert _entry_points(venv) == ["ddtree"]
    _pip_install(venv, wheelcache.wheel("sglang", "0.5.11"))
    said = _ok(cli(world, "deploy", "localhost", "--venv", str(venv)))
    assert "uninstalled" in said and "deployed (sglang 0.5.11, payload" in said, said
    assert _entry_points(venv) == []
    site = _sglang(venv).parent
    assert not list(site.glob("ddtree_sglang*")), "the plugin's files stayed"
    state = json.loads((venv / ".ddtree-deploy/payload.json").read_text())
    assert state["sglang"] == "0.5.11" and state.get("form", "patch") != "plugin"
    _ok(cli(world, "rollback", "localhost", "--venv", str(venv)))
    assert _tree(_sglang(venv)) == _tree(_sglang(fresh))


def test_a_release_outside_the_matrix_is_refused_with_the_list(world: Path) -> None:
    venv = _venv(world, "v", wheelcache.wheel("sglang", "0.5.10"))
    before = _tree(venv)
    r = cli(world, "deploy", "localhost", "--venv", str(venv))
    said = r.stdout + r.stderr
    assert r.returncode == 2, said
    assert "does not support sglang 0.5.10" in said
    assert "0.5.11 (patch set); 0.5.17" in said and "(plugin)" in said, said
    assert _tree(venv) == before
