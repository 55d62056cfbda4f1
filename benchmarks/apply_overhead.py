"""Benchmark: apply's own overhead on the lab, and plan on cached facts.

apply ct200 from a fresh lab, in-process, with each step's time recorded. "Work" is
what the issue excludes from overhead: transfers (the lane overlay, the payload),
remote installs (venv clone, package installs) and the service's start (restart and
probe until healthy). Overhead = total - work: facts, planning, the lock, re-checks,
rendering and installing the unit. Goal: <= 10% of the total. Then `plan ct200` on
cached facts as a whole CLI process, median of 5 (goal <= 0.3 s).

    .venv/bin/python benchmarks/apply_overhead.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.converge.runner import apply_host
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_lab import manager

WORK = {"venv.create", "lane.overlay", "package.install", "payload.deploy", "service.start",
        "service.probe"}


def one_apply() -> tuple[float, float]:
    """A fresh lab, then apply ct200: (total seconds, overhead seconds)."""
    manager.up()
    config = load_config(embedded_hosts_file())
    run = apply_host(config, "ct200")
    work = sum(s for kind, _title, s in run.timings if kind in WORK)
    for kind, title, s in run.timings:
        print(f"  {kind:<16} {s:6.2f}s {'(work)' if kind in WORK else '(overhead)'}  {title}")
    overhead = run.total_s - work
    print(f"apply total {run.total_s:.2f}s, work {work:.2f}s, overhead {overhead:.2f}s "
          f"= {100 * overhead / run.total_s:.1f}%")
    return run.total_s, overhead


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="applies, each on a fresh lab")
    args = ap.parse_args()
    runs = [one_apply() for _ in range(args.runs)]
    shares = sorted(100 * o / t for t, o in runs)
    print(f"apply overhead: median {statistics.median(shares):.1f}% of the total "
          f"({', '.join(f'{x:.1f}%' for x in shares)}; totals "
          f"{', '.join(f'{t:.2f}s' for t, _ in runs)}); goal <= 10%")
    cli = [sys.executable, "-m", "ddtree_deploy.cli", "plan", "ct200"]
    subprocess.run(cli, capture_output=True, check=False)  # fills the facts cache
    times = []
    for _ in range(5):
        t0 = time.monotonic()
        subprocess.run(cli, capture_output=True, check=False)
        times.append(time.monotonic() - t0)
    print(f"plan ct200 on cached facts: median {statistics.median(times):.3f}s "
          f"({', '.join(f'{x:.3f}' for x in times)}); goal <= 0.3 s")


if __name__ == "__main__":
    from ddtree_lab import lock

    with lock.session():  # the whole run holds the lab (a test session waits, or we do)
        main()
