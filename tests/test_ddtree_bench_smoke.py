"""benchmarks/ddtree_round.py runs on CPU with tiny sizes, and its heap baseline agrees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "ddtree_round.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


def test_cpu_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    tiny = "--device cpu --vocab 300 --budgets 7 31 --batches 1 3 --block 6 --top-k 4"
    proc = run(
        *tiny.split(), *["--rounds", "3", "--heap-rounds", "2", "--warmup", "1", "--out"], str(out)
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    rows = report["results"]
    assert [(r["budget"], r["batch"]) for r in rows] == [(7, 1), (31, 1), (7, 3), (31, 3)]
    for r in rows:
        assert r["agree"] is True  # the heap baseline built the very same trees and walks
        assert r["core_us"] > 0 and r["heap_us"] > 0
        assert r["speedup"] == r["heap_us"] / r["core_us"]
        assert 0 <= r["mean_accepted"] <= 5
    assert report["config"]["vocab"] == 300
    assert "core_us" in proc.stdout and "heap_us" in proc.stdout  # the printed table


def test_bad_arguments_are_clear(tmp_path: Path) -> None:
    proc = run("--device", "cpu", "--budgets", "0")
    assert proc.returncode == 2
    assert "budgets >= 1" in proc.stderr and "Traceback" not in proc.stderr
    if not torch.cuda.is_available():
        proc = run("--device", "cuda", "--out", str(tmp_path / "r.json"))
        assert proc.returncode == 2
        assert "CUDA is not available" in proc.stderr and "Traceback" not in proc.stderr
