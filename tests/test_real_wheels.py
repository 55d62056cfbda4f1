"""doctor on a venv assembled from REAL registry wheels: torch 2.9.1 (CUDA 12.8) with
sglang-kernel 0.4.2 (built for CUDA 13) — the story's ABI mismatch, no stand-ins.

Downloads about 1.2 GB once (cached under the XDG cache folder) and installs both
wheels with --no-deps into a venv kept beside them, so later runs cost seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy import xdg
from ddtree_deploy.converge.steps import _install as installer

pytestmark = pytest.mark.slow

WHEELS = ("torch==2.9.1", "sglang-kernel==0.4.2")


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, capture_output=True,
                   timeout=1800)


@pytest.fixture(scope="module")
def mixed_venv() -> Path:
    root = xdg.cache_dir() / "real-wheels"
    venv = root / "venv-torch291-cu128-sglang-kernel042"
    if (venv / ".complete").exists():
        return venv
    wheels = installer.wheelhouse([installer.Requirement(w, deps=False) for w in WHEELS],
                                  python_version="3.11", glibc="2.28", cache=root)
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    _pip("install", "-q", "--no-deps", "--no-index", "--no-compile", "--target", str(site),
         *map(str, wheels))
    (venv / ".complete").write_text("ok\n")
    return venv


def test_doctor_reports_the_cuda12_vs_13_mismatch_with_evidence(mixed_venv: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ddtree_deploy.cli", "doctor", "localhost", "--venv",
         str(mixed_venv), "--json", "--refresh"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    mix = next(f for f in report["findings"] if f["id"] == "venv.lane-mix")
    assert mix["severity"] == "error"
    evidence = json.dumps(mix["evidence"])
    assert "libcudart.so.13" in evidence and "sgl_kernel/" in evidence
    assert "12.8" in evidence or "libcudart.so.12" in evidence
    assert "overlay" in mix["remedy"]
    kernel = next(f for f in report["findings"] if f["id"] == "venv.kernel-torch")
    assert "2.11.0" in json.dumps(kernel["evidence"]) and "2.9.1" in json.dumps(kernel["evidence"])
