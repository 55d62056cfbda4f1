"""What ships where: the tool's wheel carries the data folders and the embedded hosts.yaml and no
lab code; the lab's wheel (lab/, ddtree-deploy-lab) carries the lab and adds `ddtree-deploy lab`
through the tool's entry point group. Without the lab installed, `ddtree-deploy lab` says so."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from ddtree_lab import provision

ROOT = Path(__file__).resolve().parents[1]


def _build(source: Path, out: Path, pattern: str) -> Path:
    uv = shutil.which("uv") or "/opt/ddtree-deploy-uv/bin/uv"
    subprocess.run([uv, "build", "--wheel", "--out-dir", str(out), str(source)], check=True,
                   capture_output=True)
    (built,) = out.glob(pattern)
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(ROOT, tmp_path_factory.mktemp("dist"), "ddtree_deploy-*.whl")


@pytest.fixture(scope="module")
def lab_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(ROOT / "lab", tmp_path_factory.mktemp("dist-lab"), "ddtree_deploy_lab-*.whl")


def _entry_points(whl: Path) -> str:
    z = zipfile.ZipFile(whl)
    return z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()


def test_wheel_holds_data_and_console_script(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for data in ("hosts.yaml", "templates/README.md", "overlays/README.md", "payload/README.md"):
        assert f"ddtree_deploy/_data/{data}" in names
    assert "ddtree-deploy = ddtree_deploy.cli.app:main" in _entry_points(wheel)


def test_tool_wheel_holds_no_lab_code(wheel: Path) -> None:
    z = zipfile.ZipFile(wheel)
    names = z.namelist()
    assert "ddtree_deploy/cli/app.py" in names  # the tool itself is there
    assert not [n for n in names if n.startswith(("ddtree_lab/", "ddtree_deploy/lab/"))]
    assert not [n for n in names if n.endswith((".c", ".pth"))]
    mentions = [n for n in names if n.endswith(".py") and b"ddtree_lab" in z.read(n)]
    assert mentions == []
    assert "ddtree_deploy.commands" not in _entry_points(wheel)  # the tool adds no plugin itself


def test_lab_wheel_holds_the_lab_and_its_command(lab_wheel: Path) -> None:
    z = zipfile.ZipFile(lab_wheel)
    names = z.namelist()
    for part in ("cli.py", "manager.py", *(f"standin/{m}" for m in provision.SMI_MODULES),
                 "standin/csrc/libnvml.c",
                 "standin/csrc/libcuda.c", "standin_server/ddtree_lab_standin.pth",
                 "standin_server/ddtree_lab_standin/launch_server.py"):
        assert f"ddtree_lab/{part}" in names
    assert not [n for n in names if n.startswith("ddtree_deploy/")]  # the tool is a dependency
    assert "[ddtree_deploy.commands]\nlab = ddtree_lab.cli:app" in _entry_points(lab_wheel)
    metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist: ddtree-deploy\n" in metadata


def _isolated(tmp_path: Path, *wheels: Path) -> list[str]:
    """A PYTHONPATH with ``wheels`` installed and the dev venv's other packages, but neither the
    checkout nor the venv's editable installs of the tool and the lab."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), *map(str, wheels)], check=True)
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("ddtree", "_editable_impl_ddtree", "__editable__")):
            (deps / entry.name).symlink_to(entry)
    return [str(target), str(deps)]


def _cli(tmp_path: Path, path: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-S", "-m", "ddtree_deploy.cli", *args], cwd=tmp_path,
                          capture_output=True, text=True, env={"PYTHONPATH": ":".join(path)})


def test_tool_alone_says_the_lab_is_not_installed(wheel: Path, tmp_path: Path) -> None:
    path = _isolated(tmp_path, wheel)
    r = _cli(tmp_path, path, "lab", "up", "--extra", "1")
    assert r.returncode == 2, r.stderr
    assert "`ddtree-deploy lab` is unavailable: it is not installed (install the " \
           "ddtree-deploy-lab package)" in r.stderr
    assert "Traceback" not in r.stderr
    assert _cli(tmp_path, path, "lab", "--help").returncode == 2
    listing = _cli(tmp_path, path, "--help")
    assert listing.returncode == 0 and re.search(r"\blab\s+Unavailable here", listing.stdout)
    assert _cli(tmp_path, path, "hosts", "--help").returncode == 0  # the rest works


def test_tool_and_lab_wheels_give_the_lab_commands(wheel: Path, lab_wheel: Path,
                                                    tmp_path: Path) -> None:
    r = _cli(tmp_path, _isolated(tmp_path, wheel, lab_wheel), "lab", "--help")
    assert r.returncode == 0, r.stderr
    for command in ("up", "down", "status"):
        assert command in r.stdout


def test_installed_wheel_finds_its_data_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True)
    probe = ("from ddtree_deploy.resources import data_path, embedded_hosts_file;"
             "print(embedded_hosts_file()); print(data_path('templates'))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(target)}).stdout
    hosts, templates = out.split()
    assert hosts == str(target / "ddtree_deploy/_data/hosts.yaml")
    assert templates == str(target / "ddtree_deploy/_data/templates")
    assert Path(hosts).read_text() == (ROOT / "hosts.yaml").read_text()
    # --version outside a checkout: the commit the wheel was built from (hatch_build.py)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    version = subprocess.run([sys.executable, "-c", "from ddtree_deploy.version import "
                              "version_line; print(version_line())"], cwd=tmp_path,
                             capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": str(target)}).stdout
    assert version.endswith(f"(commit {head})\n"), version
