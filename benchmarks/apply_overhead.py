"""Benchmark: apply's own overhead on the lab, and plan on cached facts.

apply ct200 from a fresh lab, in-process, with each step's time recorded. "Work" is
what the issue excludes from overhead: transfers (the lane overlay, the payload),
remote installs (venv clone, package installs) and the service's start (restart and
probe until healthy). Overhead = total - work: facts, planning, the lock, re-checks,
rendering and installing the unit. Goal: <= 10% of the total. Then `plan ct200` on
cached facts as a whole CLI process, median of 5 (goal <= 0.3 s).

    .venv/bin/python benchmarks/apply_overhead.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from ddtree_deploy.config import load_config
from ddtree_deploy.converge.runner import apply_host
from ddtree_deploy.lab import manager
from ddtree_deploy.resources import embedded_hosts_file

WORK = {"venv.create", "lane.overlay", "package.install", "payload.deploy", "service.start",
        "service.probe"}


def main() -> None:
    manager.up()
    config = load_config(embedded_hosts_file())
    run = apply_host(config, "ct200")
    work = sum(s for kind, s in run.timings if kind in WORK)
    for kind, s in run.timings:
        print(f"  {kind:<16} {s:6.2f}s {'(work)' if kind in WORK else '(overhead)'}")
    overhead = run.total_s - work
    print(f"apply total {run.total_s:.2f}s, work {work:.2f}s, overhead {overhead:.2f}s "
          f"= {100 * overhead / run.total_s:.1f}% (goal <= 10%)")
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
    main()
