"""Whether a stream is compressed: measured, not assumed.

Compression pays only when the compressor keeps ahead of the link AND the data
shrinks enough to matter. CUDA 13 libraries barely shrink (libnccl: 1.02x at
zstd -1), torch's grow 2-4x smaller; a loopback "link" outruns any compressor. So
before a stream, three numbers are measured:

- the link: bytes per second into `cat >/dev/null` on the far host (a few MiB of
  random bytes, minus the time of an empty send: the round trip);
- the ratio and the compressor's speed, on a sample of the data itself: on the
  source with its `zstd -1 -T0` (the source compresses its stream), or here with
  zstandard (the workstation compresses what it sends from its cache).

`choose` compares the time per byte: plain 1/link, compressed max(1/speed,
1/(ratio*link)); compressed only when that is at least 10% faster.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import zstandard

from ddtree_deploy.errors import DeployError
from ddtree_deploy.transport.base import Command, Transport

LINK_PROBE = 8 << 20
SAMPLE_BYTES = 16 << 20
GAIN = 0.9  # compressed must take at most this fraction of the plain time


@dataclass
class Choice:
    """What was measured and what was chosen (shown in `overlay --json`)."""

    compress: bool
    reason: str
    link_bps: float | None = None
    ratio: float | None = None
    speed_bps: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def choose(link_bps: float, ratio: float, speed_bps: float) -> Choice:
    """Compress when max(1/speed, 1/(ratio*link)) <= GAIN/link (bytes of payload per second)."""
    plain = 1.0 / max(link_bps, 1.0)
    packed = max(1.0 / max(speed_bps, 1.0), 1.0 / max(ratio * link_bps, 1.0))
    ok = packed <= GAIN * plain
    if ratio < 1.0 / GAIN:
        why = f"the data shrinks only {ratio:.2f}x"
    elif not ok:
        why = (f"the compressor ({speed_bps / 1e6:.0f} MB/s) is slower than the link "
               f"({link_bps / 1e6:.0f} MB/s) can use it")
    else:
        why = (f"{ratio:.2f}x smaller at {speed_bps / 1e6:.0f} MB/s beats the link's "
               f"{link_bps / 1e6:.0f} MB/s")
    return Choice(ok, why, link_bps, ratio, speed_bps)


def measure_link(t: Transport, nbytes: int = LINK_PROBE) -> float:
    """Bytes per second from here into `cat >/dev/null` on t's host (round trip removed)."""
    cmd = Command.shell("cat >/dev/null")
    t0 = time.monotonic()
    t.run_stream_in(cmd, io.BytesIO(b""), timeout=60).check()
    t1 = time.monotonic()
    t.run_stream_in(cmd, io.BytesIO(os.urandom(nbytes)), timeout=120).check()
    t2 = time.monotonic()
    return nbytes / max((t2 - t1) - (t1 - t0), 1e-4)


def measure_local(samples: Iterable[bytes]) -> tuple[float, float]:
    """(ratio, input bytes per second) of zstandard level 1 over the samples, here."""
    data = b"".join(samples)
    if not data:
        return 1.0, float("inf")
    cctx = zstandard.ZstdCompressor(level=1)
    t0 = time.perf_counter()
    out = cctx.compress(data)
    took = max(time.perf_counter() - t0, 1e-6)
    return len(data) / max(len(out), 1), len(data) / took


# On the source: read a sample (a slice from the middle of each of the largest files), time
# `zstd -1 -T0` over it (less the time of starting zstd).
# stdin: [[path, size], ...] relative to argv[1]; argv[2]: sample bytes.
# Prints {"zstd": bool, "bytes": n, "compressed": m, "seconds": s}.
SOURCE_SAMPLE = r"""
import json, os, shutil, subprocess, sys, time
sp, budget = sys.argv[1], int(sys.argv[2])
files = sorted(json.load(sys.stdin), key=lambda f: -f[1])[:8]
if shutil.which("zstd") is None or not files:
    print(json.dumps({"zstd": shutil.which("zstd") is not None, "bytes": 0}))
    sys.exit(0)
each = max(budget // len(files), 1 << 16)
parts = []
for rel, size in files:
    try:
        with open(os.path.normpath(os.path.join(sp, rel)), "rb") as fh:
            fh.seek(max(0, size // 2 - each // 2))
            parts.append(fh.read(each))
    except OSError:
        pass
data = b"".join(parts)
argv = ["zstd", "-q", "-1", "-T0", "-c"]
t0 = time.monotonic()
subprocess.run(argv, input=b"", stdout=subprocess.PIPE)  # the cost of starting it
t1 = time.monotonic()
proc = subprocess.run(argv, input=data, stdout=subprocess.PIPE)
took = max((time.monotonic() - t1) - (t1 - t0), 1e-6)
print(json.dumps({"zstd": True, "bytes": len(data), "compressed": len(proc.stdout),
                  "seconds": took}))
"""


def measure_source(t: Transport, python: str, site_packages: str,
                   files: list[tuple[str, int]], *, sudo: bool = False,
                   budget: int = SAMPLE_BYTES) -> tuple[bool, float, float]:
    """(has zstd, ratio, input bytes per second) of `zstd -1 -T0` on the source's own data."""
    listing = json.dumps(files).encode()
    cmd = Command.of(python, "-c", SOURCE_SAMPLE, site_packages, str(budget), stdin=listing,
                     sudo=sudo)
    r = t.run(cmd, timeout=120)
    try:
        data = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise DeployError(f"{t.host}: measuring compression on the source failed "
                          f"(exit {r.exit_code}): {r.stderr.strip()[-300:]}") from None
    n = int(data.get("bytes", 0))
    if not data.get("zstd") or n == 0:
        return bool(data.get("zstd")), 1.0, float("inf")
    ratio = n / max(int(data.get("compressed", n)), 1)
    return True, ratio, n / max(float(data.get("seconds", 0.0)), 1e-6)
