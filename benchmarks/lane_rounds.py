"""One round of the overlay's real-lane figures, and their report, wherever the hosts are.

Shared by benchmarks/overlay_real_lane.py (the lab's containers) and
benchmarks/overlay_many_cores.py (sshd's on one many-core machine behind shaped links): each
passes its own `Hosts` (how to reach a host, clone a fresh venv there, remove a path there).
The cases, in the order a round takes them:

- cold: `overlay --to FIRST:<fresh venv>` with an empty blob cache;
- densify: the wait for the cache's recompression that cold left running (detached);
- warm: the same into a second fresh venv (the cache is warm and recompressed: one hop);
- unchanged: the warm command again;
- fleet: an empty cache, a fresh venv on every fleet host, one command; each extra target
  costs (fleet - cold) / extra.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GOALS = {"cold": 0.4, "warm": 0.25, "extra": 0.25}


@dataclass
class Hosts:
    """What a round needs of the hosts: fresh venvs and removing them."""

    clone: Callable[[str, str, dict[str, str]], None]  # (host, venv, env): a fresh venv
    remove: Callable[[str, str], None]  # (host, path): rm -rf on the host
    first: str  # the single target of cold/warm/unchanged
    fleet: list[str]  # the fleet's targets, `first` among them
    home: Callable[[str], str] = lambda host: "/root"  # where fresh venvs go on a host


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, dict]:
    """Seconds of one CLI run (exit 0 or 3) and its --json answer."""
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    took = time.monotonic() - t0
    if r.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr[-1500:]}")
    return took, json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}


def wait_gone(pid: object) -> float:
    """Seconds until the detached recompression `pid` (from `--json`) has exited."""
    t0 = time.monotonic()
    if isinstance(pid, int):
        while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
            time.sleep(0.1)
    return time.monotonic() - t0


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def overlay_round(base: list[str], hosts: Hosts, blobs: Path, env: dict[str, str],
                  stages: dict[str, list[dict]]) -> dict[str, float]:
    """cold, densify, warm, unchanged, fleet and extra, in seconds; each run's --json kept
    in `stages`."""
    row: dict[str, float] = {}
    first = hosts.first
    cold, warm = f"{hosts.home(first)}/bv-cold", f"{hosts.home(first)}/bv-warm"
    shutil.rmtree(blobs, ignore_errors=True)
    hosts.clone(first, cold, env)
    hosts.clone(first, warm, env)
    row["cold"], j = timed([*base, "--to", f"{first}:{cold}"], env)
    stages["cold"].append(j)
    row["densify"] = wait_gone(j.get("recompressing_cache", {}).get("pid"))
    row["warm"], j = timed([*base, "--to", f"{first}:{warm}"], env)
    stages["warm"].append(j)
    row["unchanged"], j = timed([*base, "--to", f"{first}:{warm}"], env)
    stages["unchanged"].append(j)
    hosts.remove(first, cold)
    hosts.remove(first, warm)
    shutil.rmtree(blobs, ignore_errors=True)
    for h in hosts.fleet:
        hosts.clone(h, f"{hosts.home(h)}/bv-fleet", env)
    row["fleet"], j = timed([*base, *[a for h in hosts.fleet
                                     for a in ("--to", f"{h}:{hosts.home(h)}/bv-fleet")]], env)
    stages["fleet"].append(j)
    wait_gone(j.get("recompressing_cache", {}).get("pid"))
    for h in hosts.fleet:
        hosts.remove(h, f"{hosts.home(h)}/bv-fleet")
    row["extra"] = (row["fleet"] - row["cold"]) / max(len(hosts.fleet) - 1, 1)
    return row


def report(root: str, rounds: list[dict[str, float]], stages: dict[str, list[dict]],
           where: str, rate: str, extra: int) -> dict[str, object]:
    """Prints the medians, each ratio against its goal, and the median runs' stages; returns
    the medians and verdicts (for a JSON record)."""
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"\n{('code: ' + root + '; ') if root else ''}lane: {where}; links {rate} each way; "
          f"{len(rounds)} rounds, medians:")
    print(f"two scp -r hops:            {med['scp']:.2f}s")
    verdicts: dict[str, object] = {}
    for key, label in (("cold", "cold cache"), ("warm", "second target, cache warm"),
                       ("extra", f"each extra fleet target ({extra})")):
        ratio = med[key] / med["scp"]
        verdict = "met" if ratio <= GOALS[key] else "NOT met"
        verdicts[key] = {"seconds": round(med[key], 2), "ratio": round(ratio, 3),
                         "goal": GOALS[key], "verdict": verdict}
        print(f"{label + ':':27} {med[key]:.2f}s  ratio {ratio:.2f} (goal <= {GOALS[key]}, "
              f"{verdict})")
    print(f"cache recompression after cold (detached, waited for): {med['densify']:.2f}s")
    print(f"unchanged re-run:           {med['unchanged']:.2f}s (goal <= 1 s, "
          f"{'met' if med['unchanged'] <= 1 else 'NOT met'})")
    verdicts["unchanged"] = {"seconds": round(med["unchanged"], 2), "goal_s": 1,
                             "verdict": "met" if med["unchanged"] <= 1 else "NOT met"}
    for kind, runs in stages.items():
        mid = sorted(runs, key=lambda j: j.get("seconds", {}).get("total", 0))[len(runs) // 2]
        print(f"stages of the median {kind} run: {json.dumps(mid.get('seconds', {}))}")
        for t in mid.get("targets", [mid]):
            print(f"  {t.get('target', {}).get('host')}: {json.dumps(t.get('seconds', {}))} "
                  f"pushed {t.get('bytes_pushed')} bytes, "
                  f"compression {json.dumps(t.get('compression'))}")
        if mid.get("source_compression"):
            print(f"  source stream: {json.dumps(mid['source_compression'])}")
    return {"medians": {k: round(v, 3) for k, v in med.items()}, "goals": verdicts,
            "rounds": rounds}
