"""installer: wheelhouse from the registry (real wheels), uv pushed to a host, offline install.

The "host" is this machine through LocalTransport, with HOME pointed at a scratch
folder and PATH cut down so the machine's own uv is not found; the venv is a
scratch `python -m venv`. Wheels are real, from `pip download` (cached per session).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from ddtree_deploy.converge.steps import _install as installer
from ddtree_deploy.converge.steps._install import (
    Requirement,
    install,
    satisfied,
    uninstall,
    wheelhouse,
)
from ddtree_deploy.converge.steps._install_uv import UV_VERSION, ensure_uv
from ddtree_deploy.errors import ConfigError, RemoteCommandError
from ddtree_deploy.transport import LocalTransport

SOUNDFILE = Requirement("soundfile==0.13.1", deps=True)
HOST_PY = platform.python_version()  # the scratch venv's interpreter is this one


@pytest.fixture(scope="session")
def xdg_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(scope="session")
def soundfile_wheels(xdg_cache: Path) -> list[Path]:
    return wheelhouse([SOUNDFILE], python_version=HOST_PY, glibc="2.36", cache=xdg_cache)


@pytest.fixture()
def host(tmp_path: Path, xdg_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch HOME on this machine with no uv on PATH; yields the HOME."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))  # the workstation's uv wheel
    yield home


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def _names(wheels: list[Path]) -> set[str]:
    return {str(parse_wheel_filename(w.name)[0]) for w in wheels}


# -- satisfied ----------------------------------------------------------------


def test_satisfied_on_specifiers() -> None:
    dists = {"soundfile": "0.13.1", "flashinfer-python": "0.6.3", "torch": "2.11.0+cu128"}
    assert satisfied("soundfile==0.13.1", dists)
    assert not satisfied("soundfile==0.13.0", dists)
    assert satisfied("flashinfer_python>=0.6", dists)  # names compare canonically
    assert not satisfied("flashinfer-python>=0.6.8", dists)
    assert satisfied("torch==2.11.0", dists)  # a local label matches the public version
    assert not satisfied("xgrammar>=0.1.10", dists)  # missing
    assert satisfied("Soundfile", dists)
    assert not satisfied("soundfile", {"soundfile": "not-a-version"})
    assert satisfied("sglang>=0.5.11rc0", {"sglang": "0.5.11rc1"})


def test_bad_requirement_text_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a valid requirement"):
        satisfied("soundfile >= ", {})
    with pytest.raises(ConfigError, match="not a valid requirement"):
        Requirement("--index-url=http://x", deps=False)
    with pytest.raises(ConfigError, match="direct URL"):
        Requirement("sglang @ https://example.invalid/sglang.whl", deps=False)


def test_platform_tags_run_from_2_17_to_the_hosts_glibc() -> None:
    tags = installer.platform_tags("2.36")
    assert tags[0] == "manylinux_2_17_x86_64" and "manylinux_2_36_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags
    assert tags[-2:] == ["manylinux2014_x86_64", "any"]
    assert installer.platform_tags(None) == ["manylinux_2_17_x86_64", "manylinux2014_x86_64",
                                             "any"]
    with pytest.raises(ConfigError, match="glibc"):
        installer.platform_tags("musl")
    with pytest.raises(ConfigError, match="CPython"):
        wheelhouse([SOUNDFILE], python_version="2.7", glibc="2.36")


# -- wheelhouse ---------------------------------------------------------------


def test_wheelhouse_resolves_deps_for_the_target_and_caches(
    soundfile_wheels: list[Path], xdg_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = xdg_cache / "wheelhouse" / f"cp3{sys.version_info.minor}"
    assert all(w.parent == folder and w.is_file() for w in soundfile_wheels)
    assert {"soundfile", "cffi", "pycparser"} <= _names(soundfile_wheels)
    for wheel in soundfile_wheels:
        for tag in parse_wheel_filename(wheel.name)[3]:
            assert tag.interpreter in ("py3", "py2", f"cp3{sys.version_info.minor}")
            assert tag.platform == "any" or tag.platform.startswith("manylinux")
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.whl")}
    # Any pip run now would fail (no index, no links): a cached answer runs none.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    again = wheelhouse([SOUNDFILE], python_version=HOST_PY, glibc="2.36", cache=xdg_cache)
    assert again == soundfile_wheels
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("*.whl")} == before


def test_wheelhouse_without_deps_is_the_one_wheel(soundfile_wheels: list[Path],
                                                   xdg_cache: Path) -> None:
    alone = wheelhouse([Requirement("soundfile==0.13.1", deps=False)], python_version=HOST_PY,
                       glibc="2.36", cache=xdg_cache)
    assert [w.name for w in alone] == [w.name for w in soundfile_wheels
                                       if w.name.startswith("soundfile-")]


def test_wheelhouse_names_the_requirement_pip_cannot_find(xdg_cache: Path) -> None:
    with pytest.raises(installer.DeployError, match=r"pip could not download soundfile==0\.0\.1"):
        wheelhouse([Requirement("soundfile==0.0.1", deps=False)], python_version=HOST_PY,
                   glibc="2.36", cache=xdg_cache)


# -- ensure_uv ----------------------------------------------------------------


def test_ensure_uv_pushes_the_binary_once_and_replaces_a_stale_one(host: Path) -> None:
    t = LocalTransport()
    path = ensure_uv(t, sudo=False)
    assert path == f"{host}/.ddtree-deploy/bin/uv"
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith(f"uv {UV_VERSION}")
    assert os.stat(path).st_mode & 0o777 == 0o755
    inode = os.stat(path).st_ino
    assert ensure_uv(t, sudo=False) == path
    assert os.stat(path).st_ino == inode  # re-used, not pushed again
    Path(path).write_text("#!/bin/sh\necho 'uv 0.0.1'\n")
    assert ensure_uv(t, sudo=False) == path
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith(f"uv {UV_VERSION}")


def test_ensure_uv_prefers_the_hosts_own_uv(host: Path) -> None:
    own = host / ".local" / "bin" / "uv"
    own.parent.mkdir(parents=True)
    own.write_text("#!/bin/sh\necho 'uv 0.9.0'\n")
    own.chmod(0o755)
    assert ensure_uv(LocalTransport(), sudo=False) == str(own)
    assert not (host / ".ddtree-deploy").exists()


# -- install ------------------------------------------------------------------


def test_install_offline_then_again_is_a_no_op(
    host: Path, tmp_path: Path, soundfile_wheels: list[Path]
) -> None:
    venv = _venv(tmp_path / "venv")
    t = LocalTransport()
    install(t, str(venv), [SOUNDFILE], soundfile_wheels, sudo=False)
    probe = [str(venv / "bin/python"), "-c", "import soundfile; print(soundfile.__version__)"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "0.13.1\n"
    pushed = host / ".ddtree-deploy" / "wheelhouse"
    assert {p.name for p in pushed.glob("*.whl")} == {w.name for w in soundfile_wheels}
    inodes = {p.name: p.stat().st_ino for p in pushed.glob("*.whl")}
    dist_info = next(venv.glob("lib/python3*/site-packages/soundfile-0.13.1.dist-info"))
    installed_at = dist_info.stat().st_ino
    output = install(t, str(venv), [SOUNDFILE], soundfile_wheels, sudo=False)
    assert "Installed" not in output
    assert {p.name: p.stat().st_ino for p in pushed.glob("*.whl")} == inodes  # nothing re-sent
    assert dist_info.stat().st_ino == installed_at  # nothing reinstalled
    uninstall(t, str(venv), ["soundfile"], sudo=False)
    assert subprocess.run(probe, capture_output=True, check=False).returncode != 0


def test_install_without_deps_brings_only_the_package(
    host: Path, tmp_path: Path, soundfile_wheels: list[Path]
) -> None:
    venv = _venv(tmp_path / "venv")
    t = LocalTransport()
    install(t, str(venv), [Requirement("soundfile==0.13.1", deps=False)], soundfile_wheels,
            sudo=False)
    site = next(venv.glob("lib/python3*/site-packages"))
    assert list(site.glob("soundfile-0.13.1.dist-info"))
    assert not list(site.glob("cffi-*.dist-info"))


def test_install_failure_carries_uvs_words(
    host: Path, tmp_path: Path, soundfile_wheels: list[Path]
) -> None:
    venv = _venv(tmp_path / "venv")
    t = LocalTransport()
    with pytest.raises(RemoteCommandError, match=r"uv could not install soundfile==0\.12\.1") as e:
        install(t, str(venv), [Requirement("soundfile==0.12.1", deps=True)], soundfile_wheels,
                sudo=False)
    assert "0.12.1" in str(e.value).split("\n", 1)[1]  # uv's own explanation follows
    with pytest.raises(RemoteCommandError, match="no venv at"):
        install(t, str(tmp_path / "absent"), [SOUNDFILE], soundfile_wheels, sudo=False)


# -- what apply shows while they run (issue 31) -------------------------------


def test_pip_and_uv_say_what_they_do_line_by_line_as_they_run(
    host: Path, tmp_path: Path, soundfile_wheels: list[Path], xdg_cache: Path
) -> None:
    """pip runs on the workstation for the host: its command and lines are told to the host
    transport's observers and listeners, marked (workstation); uv's lines on the host are
    told as uv prints them (apply -vv, apply's status line)."""
    heard: list[tuple[str, str, str]] = []
    seen: list[tuple[str, int | None]] = []
    t = LocalTransport("ct200")
    t.listeners = (lambda c, s, ln: heard.append((c, s, ln)),)
    t.observers = (lambda c, code, took, out, err: seen.append((c, code)),)
    with pytest.raises(installer.DeployError):
        wheelhouse([Requirement("soundfile==0.0.1", deps=False)], python_version=HOST_PY,
                   glibc="2.36", cache=xdg_cache, beside=t)
    pip = [(c, s, ln) for c, s, ln in heard if " pip download " in c]
    assert pip and all(c.startswith("(workstation) ") for c, _s, _ln in pip)
    assert any(s == "err" and "soundfile==0.0.1" in ln for _c, s, ln in pip)  # pip's ERROR
    assert seen[-1][0].startswith("(workstation) ") and seen[-1][1] == 1
    venv = _venv(tmp_path / "venv")
    install(t, str(venv), [SOUNDFILE], soundfile_wheels, sudo=False)
    uv = [ln for c, _s, ln in heard if " pip install " in c]
    assert any(ln.startswith("Installed ") for ln in uv), uv
    assert any("soundfile==0.13.1" in ln for ln in uv)
