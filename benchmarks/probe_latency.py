"""Benchmark: how fast the probe gives its verdict, in the lab (issue 4's goals).

1. Crash: a service whose process exits at start (the story's missing soundfile,
   in a copy of ct129's ml-env): time from the process's exit
   (systemd's ExecMainExitTimestampMonotonic) to the probe's verdict. Goal <= 2 s.
2. Healthy: time from the server's first /health 200 (its "fired up and ready"
   journal line, __MONOTONIC_TIMESTAMP) to the probe's healthy verdict. Goal <= 1 s.

Containers share the kernel's CLOCK_MONOTONIC with the workstation, so host and
workstation times compare directly. Median of N runs each (default 10).

    .venv/bin/python benchmarks/probe_latency.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.health.check import ProbeTarget, probe_service
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport
from ddtree_lab import manager

CLI = [sys.executable, "-m", "ddtree_deploy.cli"]


def sh(t, script: str, *args: str) -> str:
    r = t.run(Command.shell(script, *args), timeout=120)
    if not r.ok:
        raise SystemExit(f"{script}: {r.stderr}")
    return r.stdout


def up(name: str, *flags: str) -> None:
    subprocess.run([*CLI, "service", "up", "ct129", "--name", name, "--no-probe", *flags],
                   check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    if not all(r.running and r.ssh for r in manager.status() or []) or not manager.status():
        manager.up()
    config = load_config(embedded_hosts_file())
    crash, healthy = [], []
    with open_transport(config, "ct129") as t:
        sh(t, "rm -rf /root/env-bench && cp -a /root/ml-env /root/env-bench && "
              "/root/env-bench/bin/python -m pip uninstall -q -y soundfile")
        up("bench-crash", "--gpu", "0", "--venv", "/root/env-bench",
           "--attention-backend", "triton")
        up("bench-ok", "--gpu", "0", "--port", "30200", "--venv", "/root/ml-env",
           "--attention-backend", "triton")
        sh(t, "systemctl stop bench-ok bench-crash")
        for _ in range(args.runs):
            # crash: restart the unit, probe at once; the verdict must follow the exit quickly
            sh(t, "systemctl reset-failed bench-crash; systemctl restart bench-crash")
            v = probe_service(t, ProbeTarget(port=30000, unit="bench-crash.service"),
                              deadline_s=60)
            done = time.monotonic()
            exit_us = int(sh(t, "systemctl show -p ExecMainExitTimestampMonotonic --value "
                                "bench-crash").strip() or 0)
            assert v.status == "unhealthy", v.reason
            crash.append(done - exit_us / 1e6)
            sh(t, "systemctl stop bench-crash; systemctl reset-failed bench-crash")
            # healthy: the verdict must follow the first /health 200 quickly
            cursor = sh(t, "journalctl -u bench-ok -n 0 --show-cursor -q --no-pager | "
                           "sed -n 's/^-- cursor: //p'").strip()
            sh(t, "systemctl reset-failed bench-ok; systemctl restart bench-ok")
            verdict_at = _healthy_at(t)
            after = ['--after-cursor "$1"', cursor] if cursor else ["", ""]
            lines = sh(t, f"journalctl -u bench-ok -o json --no-pager -q {after[0]}",
                       *([after[1]] if cursor else []))
            ready = [json.loads(ln) for ln in lines.splitlines()
                     if "fired up and ready" in json.loads(ln).get("MESSAGE", "")]
            ready_at = int(ready[0]["__MONOTONIC_TIMESTAMP"]) / 1e6
            healthy.append(verdict_at - ready_at)
            sh(t, "systemctl stop bench-ok")
        for name in ("bench-crash", "bench-ok"):
            subprocess.run([*CLI, "service", "down", "ct129", name, "--remove"],
                           capture_output=True, check=False)
        sh(t, "rm -rf /root/env-bench")
    print(f"crash exit -> verdict: median {statistics.median(crash):.2f}s over {len(crash)} "
          f"({', '.join(f'{x:.2f}' for x in crash)}); goal <= 2 s")
    print(f"/health 200 -> healthy verdict: median {statistics.median(healthy):.2f}s over "
          f"{len(healthy)} ({', '.join(f'{x:.2f}' for x in healthy)}); goal <= 1 s")


def _healthy_at(t) -> float:
    v = probe_service(t, ProbeTarget(port=30200, unit="bench-ok.service"), deadline_s=60)
    at = time.monotonic()
    assert v.status == "healthy", v.reason
    return at


if __name__ == "__main__":
    from ddtree_lab import lock

    with lock.session():  # the whole run holds the lab (a test session waits, or we do)
        main()
