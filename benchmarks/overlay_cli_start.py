"""Benchmark: the whole CLI's cost of an unchanged `overlay` re-run, without the network.

`ddtree-deploy --hosts H overlay --abi cu130 --to ct200:/root/bv --json` runs as a process of
its own with `run_fleet` answering "unchanged" at once (no connection made): what is left is the
interpreter's start, the imports, the hosts and lane files, the summary. The lab's re-run adds
the overlay's own work (both manifests over kept masters, the plan: `seconds.total` of its
`--json`, about 0.2 s) to this. Checkouts `--roots A B` alternate (PYTHONPATH=root), `--runs`
each; prints the medians of wall and CPU (user + system) seconds, B/A.

    .venv/bin/python benchmarks/overlay_cli_start.py --roots /tmp/before /work/main --runs 15
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# run_fleet stubbed before the CLI runs (an unchanged plan for every target).
STUB = """
import sys
import ddtree_deploy.overlay.run as run
from ddtree_deploy.overlay.model import Endpoint, OverlayPlan

def run_fleet(config, lane, targets, **kw):
    return run.FleetResult([run.OverlayResult(h, v, plan=OverlayPlan(
        lane=lane.lane, source=Endpoint(host="ct129", venv="/root/ml-env"),
        target=Endpoint(host=h, venv=v), id="0" * 64)) for h, v in targets])

run.run_fleet = run_fleet
from ddtree_deploy.cli.app import main
main(sys.argv[1:])
"""
HOSTS = ("version: 1\nhosts:\n  ct129:\n    address: 10.77.0.2\n    user: root\n"
         "  ct200:\n    address: 10.77.0.3\n    user: root\n")


def once(root: str, work: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": root, "XDG_CACHE_HOME": str(work / "cache"),
           "XDG_STATE_HOME": str(work / "state")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", STUB, "--hosts", str(work / "hosts.yaml"),
                        "overlay", "--abi", "cu130", "--to", "ct200:/root/bv", "--json"],
                       env=env, capture_output=True, text=True, timeout=120,
                       cwd=work)  # not a checkout's folder: `-c` puts the cwd first on sys.path
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0 or '"unchanged"' not in r.stdout:
        raise SystemExit(f"{root}: exit {r.returncode}: {r.stderr[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--roots", nargs=2, required=True, metavar=("A", "B"))
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ovl-cli-"))
    (work / "hosts.yaml").write_text(HOSTS)
    got: dict[str, list[tuple[float, float]]] = {r: [] for r in args.roots}
    for _ in range(args.runs):
        for root in args.roots:
            got[root].append(once(root, work))
    for root in args.roots:
        wall = statistics.median(w for w, _ in got[root])
        cpu = statistics.median(c for _, c in got[root])
        print(f"{root}: wall {wall:.3f}s, cpu {cpu:.3f}s (median of {args.runs})")
    a, b = args.roots
    ratio = statistics.median(w for w, _ in got[b]) / statistics.median(w for w, _ in got[a])
    print(f"B/A wall {ratio:.2f}")


if __name__ == "__main__":
    main()
