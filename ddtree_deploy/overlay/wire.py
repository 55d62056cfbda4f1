"""Whether a stream is compressed: measured, not assumed.

Compression pays only when the compressor keeps ahead of the link AND the data
shrinks enough to matter: CUDA 13 libraries barely shrink, torch's do; a loopback
"link" outruns any compressor (the figures: benchmarks/RESULTS.md, "Bulk transfer"
and "Overlay on the real CUDA 13 lane"). So before a stream, three numbers are
measured:

- the link: bytes per second into `cat >/dev/null` on the far host (a few MiB of
  random bytes, minus the time of an empty send: the round trip);
- the ratio and the compressor's speed, on a sample of the data itself: on the
  source with its `zstd -1 -T0` (remote/overlay_sample.py; the source compresses its
  stream), or here with
  zstandard (the workstation compresses what it sends from its cache).

`choose` compares the time per byte: plain 1/link, compressed max(1/speed,
1/(ratio*link)); compressed only when that is at least 10% faster. A stream from the
cache sends its frames as stored (transfer.py): its ratio is theirs, its speed unbounded.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import zstandard

from ddtree_deploy.remote.bundle import text
from ddtree_deploy.remote.runner import run_json
from ddtree_deploy.transport.base import Transport
from ddtree_deploy.transport.command import Command

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
    elif math.isinf(speed_bps):
        why = (f"{ratio:.2f}x smaller as the cache stores it beats the link's "
               f"{link_bps / 1e6:.0f} MB/s")
    else:
        why = (f"{ratio:.2f}x smaller at {speed_bps / 1e6:.0f} MB/s beats the link's "
               f"{link_bps / 1e6:.0f} MB/s")
    return Choice(ok, why, link_bps, ratio, None if math.isinf(speed_bps) else speed_bps)


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


def measure_source(t: Transport, python: str, site_packages: str,
                   files: list[tuple[str, int]], *, sudo: bool = False,
                   budget: int = SAMPLE_BYTES) -> tuple[bool, float, float]:
    """(has zstd, ratio, input bytes per second) of `zstd -1 -T0` on the source's own data."""
    listing = json.dumps(files).encode()
    data = run_json(t, text("overlay_sample.py"), (site_packages, str(budget)), python=python,
                    stdin=listing, sudo=sudo, timeout=120,
                    what="measuring compression on the source")
    n = int(data.get("bytes", 0))
    if not data.get("zstd") or n == 0:
        return bool(data.get("zstd")), 1.0, float("inf")
    ratio = n / max(int(data.get("compressed", n)), 1)
    return True, ratio, n / max(float(data.get("seconds", 0.0)), 1e-6)
