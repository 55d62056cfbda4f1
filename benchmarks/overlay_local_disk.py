"""Benchmark: the overlay's disk work on this machine, no network: code A against code B.

The lane's real libraries (the four CUDA 13 wheels of overlay_real_lane.py, unpacked into
a work folder: 1.25 GB) go through the overlay's own streams with LocalTransport:

- fetch: the source's tar writer -> the workstation's blob cache (hash, compress, write);
- push: the cache -> a target's staging receiver (decompress, hash, write);
- relay: source -> cache and staging at once (the cold command's stream).

Each measurement runs in a process of its own with PYTHONPATH set to one checkout (`--roots
A B`: e.g. a `git archive` of the commit before a change, and the working tree), alternating
A, B, A, B, ...; `sync` runs before each, outside the timing, and each result is durable when
its call returns (whatever the code's way of getting there), so the seconds compare. Prints
every run and the medians, B/A as a ratio.

    .venv/bin/python benchmarks/overlay_local_disk.py --roots /tmp/base /work/main [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

WHEELS = ("nvidia_cublas", "nvidia_cuda_nvrtc", "nvidia_cusparse", "nvidia_nccl_cu13")
KINDS = ("fetch", "push", "relay")


def wheels() -> list[Path]:
    from ddtree_deploy import xdg

    folder = xdg.cache_dir() / "bench" / "wheels"
    found = sorted(p for p in folder.glob("*.whl") if p.name.split("-")[0] in WHEELS)
    if len(found) != len(WHEELS):
        raise SystemExit(f"{folder}: needs the four wheels of benchmarks/overlay_real_lane.py "
                         "(run it once, or `pip download --no-deps` them there)")
    return found


def prepare(work: Path) -> Path:
    """The unpacked lane and its entries (entries.json), made once per work folder."""
    sp = work / "src" / "lib" / "python3.11" / "site-packages"
    listing = work / "entries.json"
    if listing.exists():
        return listing
    sp.mkdir(parents=True, exist_ok=True)
    entries = []
    for whl in wheels():
        with zipfile.ZipFile(whl) as z:
            z.extractall(sp)
            for name in z.namelist():
                if name.endswith("/"):
                    continue
                data = (sp / name).read_bytes()
                entries.append({"path": name, "sha256": hashlib.sha256(data).hexdigest(),
                                "size": len(data)})
    listing.write_text(json.dumps({"site": str(sp), "entries": entries}))
    return listing


def one(kind: str, listing: Path, scratch: Path) -> float:
    """One measurement with the ddtree_deploy on sys.path; seconds."""
    from ddtree_deploy.overlay.blobcache import BlobCache
    from ddtree_deploy.overlay.model import FileEntry
    from ddtree_deploy.overlay.relay import Destination, relay
    from ddtree_deploy.overlay.transfer import fetch, push
    from ddtree_deploy.transport import LocalTransport

    data = json.loads(listing.read_text())
    files = [FileEntry(**e) for e in data["entries"]]
    host, py = LocalTransport(), sys.executable
    cache = BlobCache(scratch / "cache")
    staging = scratch / "v" / ".ddtree-deploy" / "overlay" / "staging" / "p1"
    if kind == "push":  # the cache filled first, untimed
        fetch(host, data["site"], files, cache, python=py, compress=False)
        os.sync()
    t0 = time.monotonic()
    if kind == "fetch":
        fetch(host, data["site"], files, cache, python=py, compress=False)
    elif kind == "push":
        push(host, str(staging), files, cache, python=py, compress=False)
    else:
        dest = Destination(label="local", transport=host, staging=str(staging), files=files,
                           python=py)
        relay(host, data["site"], [dest], cache, python=py, compress="never")
        if dest.error is not None:
            raise SystemExit(f"relay: {dest.error}")
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--roots", nargs=2, metavar=("A", "B"), help="two checkouts to compare")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ovl-local-disk")
    ap.add_argument("--one", nargs=2, metavar=("KIND", "SCRATCH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps({"seconds": one(args.one[0], args.work / "entries.json",
                                         Path(args.one[1]))}))
        return
    if not args.roots:
        ap.error("--roots A B is needed")
    listing = prepare(args.work)
    total = sum(e["size"] for e in json.loads(listing.read_text())["entries"])
    print(f"lane: {total} bytes in {len(json.loads(listing.read_text())['entries'])} files")
    runs: dict[tuple[str, str], list[float]] = {}
    for n in range(args.rounds):
        for kind in args.kinds:
            for root in args.roots:
                scratch = Path(tempfile.mkdtemp(prefix="ovl-", dir=args.work))
                try:
                    subprocess.run(["sync"], check=True)
                    env = {**os.environ, "PYTHONPATH": root}
                    out = subprocess.run([sys.executable, __file__, "--work", str(args.work),
                                          "--one", kind, str(scratch)], env=env, check=True,
                                         capture_output=True, text=True).stdout
                    s = json.loads(out.strip().splitlines()[-1])["seconds"]
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
                runs.setdefault((kind, root), []).append(s)
                print(f"round {n + 1} {kind} {root}: {s:.2f}s ({total / s / 1e6:.0f} MB/s)",
                      flush=True)
    a, b = args.roots
    print("\nmedians:")
    for kind in args.kinds:
        ma, mb = statistics.median(runs[(kind, a)]), statistics.median(runs[(kind, b)])
        print(f"{kind:6} A {ma:.2f}s  B {mb:.2f}s  B/A {mb / ma:.2f}")


if __name__ == "__main__":
    main()
