"""The wheel carries the data folders and the embedded hosts.yaml (package data)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv") or "/opt/ddtree-deploy-uv/bin/uv"
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([uv, "build", "--wheel", "--out-dir", str(out), str(ROOT)], check=True,
                   capture_output=True)
    (built,) = out.glob("ddtree_deploy-*.whl")
    return built


def test_wheel_holds_data_and_console_script(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for data in ("hosts.yaml", "templates/README.md", "overlays/README.md", "payload/README.md"):
        assert f"ddtree_deploy/_data/{data}" in names
    assert "ddtree_deploy/lab/standin/nvidia_smi.py" in names
    assert any(n.startswith("ddtree_deploy/lab/standin_server/ddtree_lab_standin/") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "ddtree-deploy = ddtree_deploy.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


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
