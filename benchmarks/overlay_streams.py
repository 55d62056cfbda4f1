"""Benchmark: does one stream fill the lab's shaped link, or would two streams move more?

The lab up with `--link-rate` (tc tbf both ways on each host's link); then, in turn and
alternating for each round, from the workstation to ct200 over the lab's OpenSSH (what the
overlay's streams use): one `ssh ct200 'cat >/dev/null'` of BYTES random bytes, and two of
BYTES/2 at the same time. Both directions of the relay cross such a link (ct129 -> here,
here -> ct200); the far side of this one does the receiver's work (decrypt), as in an overlay.

    flock /tmp/ddtree-lab-session.lock .venv/bin/python benchmarks/overlay_streams.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from overlay_real_lane import ssh_opts  # type: ignore[import-not-found]

from ddtree_lab import manager


def send(address: str, path: Path) -> None:
    with path.open("rb") as fh:
        subprocess.run(["ssh", *ssh_opts(), f"root@{address}", "cat >/dev/null"], stdin=fh,
                       check=True, timeout=600)


def streams(address: str, parts: list[Path]) -> float:
    threads = [threading.Thread(target=send, args=(address, p)) for p in parts]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--rate", default="1gbit")
    args = ap.parse_args()
    manager.up(link_rate=args.rate)
    try:
        address = {r.name: r.address for r in manager.status()}["ct200"]
        with tempfile.TemporaryDirectory() as tmp:
            whole, a, b = (Path(tmp) / n for n in ("whole", "a", "b"))
            data = os.urandom(args.mib << 20)
            whole.write_bytes(data)
            a.write_bytes(data[: len(data) // 2])
            b.write_bytes(data[len(data) // 2:])
            del data
            one, two = [], []
            for n in range(args.rounds):
                one.append(streams(address, [whole]))
                two.append(streams(address, [a, b]))
                print(f"round {n + 1}: one stream {one[-1]:.2f}s, two streams {two[-1]:.2f}s",
                      flush=True)
        mb = (args.mib << 20) / 1e6
        m1, m2 = statistics.median(one), statistics.median(two)
        print(f"{args.mib} MiB to ct200 over a {args.rate} link, medians: one stream {m1:.2f}s "
              f"({mb / m1:.0f} MB/s), two streams {m2:.2f}s ({mb / m2:.0f} MB/s)")
    finally:
        manager.down()


if __name__ == "__main__":
    main()
