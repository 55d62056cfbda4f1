"""doctor on a venv assembled from REAL registry wheels: torch 2.9.1 (CUDA 12.8) with
sglang-kernel 0.4.2 (built for CUDA 13) — the story's ABI mismatch, no stand-ins.

Both wheels (about 1.2 GB) come from tests/wheels.toml (fetched by the test command before the
tiers) and are installed with --no-deps into a venv of the module's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import wheelcache

pytestmark = pytest.mark.slow

WHEELS = (("torch", "2.9.1"), ("sglang-kernel", "0.4.2"))  # tests/wheels.toml


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, capture_output=True,
                   timeout=1800)


@pytest.fixture(scope="module")
def mixed_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = [wheelcache.wheel(name, version) for name, version in WHEELS]
    venv = tmp_path_factory.mktemp("real-wheels") / "venv-torch291-cu128-sglang-kernel042"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    _pip("install", "-q", "--no-deps", "--no-index", "--no-compile", "--target", str(site),
         *map(str, wheels))
    return venv


def test_doctor_reports_the_cuda12_vs_13_mismatch_with_evidence(mixed_venv: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ddtree_deploy.cli", "doctor", "localhost", "--venv",
         str(mixed_venv), "--json", "--refresh"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)["results"]  # docs/json.md
    mix = next(f for f in report["findings"] if f["id"] == "venv.lane-mix")
    assert mix["severity"] == "error"
    evidence = json.dumps(mix["evidence"])
    assert "libcudart.so.13" in evidence and "sgl_kernel/" in evidence
    assert "12.8" in evidence or "libcudart.so.12" in evidence
    assert "overlay" in mix["remedy"]
    kernel = next(f for f in report["findings"] if f["id"] == "venv.kernel-torch")
    assert "2.11.0" in json.dumps(kernel["evidence"]) and "2.9.1" in json.dumps(kernel["evidence"])
