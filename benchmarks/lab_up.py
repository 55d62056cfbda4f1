"""Benchmark: `ddtree-deploy lab up`, cold (caches purged) and warm (caches present).

Goals (issue "Foundation"): cold under 180 s, warm under 30 s. Each run is the
real console command; the lab is taken down between runs. Prints the median of
the warm runs, each run, and the ratio to the goal.

    .venv/bin/python benchmarks/lab_up.py [--warm-runs 5] [--cold]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

CLI = [str(Path(sys.executable).with_name("ddtree-deploy"))]


def timed(*args: str) -> float:
    t0 = time.monotonic()
    subprocess.run([*CLI, *args], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm-runs", type=int, default=5)
    ap.add_argument("--cold", action="store_true",
                    help="also purge the caches and time one cold up")
    args = ap.parse_args()
    if args.cold:
        timed("lab", "down", "--purge")
        cold = timed("lab", "up")
        print(f"cold lab up: {cold:.1f}s (goal 180s, ratio {cold / 180:.2f})")
        timed("lab", "down")
    warm = []
    for _ in range(args.warm_runs):
        warm.append(timed("lab", "up"))
        timed("lab", "down")
    med = statistics.median(warm)
    print(f"warm lab up: median {med:.1f}s over {len(warm)} runs "
          f"({', '.join(f'{w:.1f}' for w in warm)}); goal 30s, ratio {med / 30:.2f}")


if __name__ == "__main__":
    from ddtree_lab import lock

    with lock.session():  # the whole run holds the lab (a test session waits, or we do)
        main()
