"""Whether a stream is compressed: measured, not assumed.

Compression pays only when the compressor keeps ahead of the link AND the data
shrinks enough to matter: CUDA 13 libraries barely shrink, torch's do; a loopback
"link" outruns any compressor (the figures: benchmarks/RESULTS.md, "Bulk transfer"
and "Overlay on the real CUDA 13 lane"). So before a stream, three numbers are
measured:

- the link, the way the stream goes (remote/overlay_link_probe.py: 16 MiB, the first quarter
  untimed): from the source, one random MiB over and over, timed here as it arrives
  (`measure_link_down`); toward a target, random bytes timed there (`measure_link`); where it
  cannot be measured the stream goes plain and says why;
- the ratio and the compressor's speed, on a sample of the data itself: on the
  source with its `zstd -T0` and the stream's flags (remote/overlay_sample.py; the source
  compresses its stream), or here with
  zstandard (the workstation compresses what it sends from its cache);
- for the source's stream, what compressing costs in CPU (`Cpus`): the CPU seconds per
  byte of the source's zstd and of one `zstd -d` on the same sample (the workstation's
  reader and each target decompress it), and the cores each end has to spare (its CPUs,
  less its load average, less one for the stream's own work there: ssh, the tar, the
  hashing and the cache; at least one).

`choose` compares the time per byte: plain 1/link, compressed max(1/speed,
1/(ratio*link) + cpu) where cpu is the compressing and decompressing, each divided by the
spare cores of its end: on busy hosts (the lab: every host on the same 2 cores, load
above 1) it adds to the stream's time, on idle many-core hosts it all but vanishes.
Compressed only when that is at least 10% faster. Run E (benchmarks/RESULTS.md) measured
why: under load the plain stream ran faster than the compressed one that the old rule
(max(1/speed, 1/(ratio*link)), the CPU taken as free) chose. A stream from the cache
sends its frames as stored (transfer.py): its ratio is theirs, its speed unbounded, and
no CPU is counted (nothing is compressed for it; the target's `zstd -d` is cheap).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import zstandard

from ddtree_deploy.errors import CommandTimeout, DeployError
from ddtree_deploy.remote.bundle import text
from ddtree_deploy.remote.overlay_link_probe import Arrivals
from ddtree_deploy.remote.runner import failure, run_json, script_command
from ddtree_deploy.transport.base import Transport

LINK_PROBE = 16 << 20
LINK_TIMEOUT = 60.0  # a probe still going then: the link is slower than LINK_PROBE/this
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
    cpu_s_per_gb: float | None = None  # compressing's CPU per GB of payload, over spare cores
    spare_cores: float | None = None  # the fewer of the two ends'

    def as_dict(self) -> dict[str, object]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Cpus:
    """What compressing the source's stream costs in CPU, and the cores there are to pay it."""

    compress_cpu: float  # CPU seconds per payload byte: the source's zstd
    decompress_cpu: float  # CPU seconds per payload byte: one `zstd -d`
    spare_source: float  # cores: spare_cores(cpus, load) on the source
    spare_here: float  # ... and on the workstation

    def per_byte(self) -> float:
        """CPU time per payload byte, each end's over its spare cores: the source compresses,
        the workstation's reader decompresses, each target decompresses (a target's spare
        cores are not measured: taken as the source's)."""
        return (self.compress_cpu / self.spare_source + self.decompress_cpu / self.spare_here
                + self.decompress_cpu / self.spare_source)


def spare_cores(cpus: int, load: float) -> float:
    """Cores a stream's compression can have: the CPUs less the load less one for the stream's
    own work on that host, at least one (the compression then shares it: its time adds)."""
    return max(1.0, cpus - load - 1.0)


def choose(link_bps: float, ratio: float, speed_bps: float, cpus: Cpus | None = None) -> Choice:
    """Compress when max(1/speed, 1/(ratio*link) + cpu) <= GAIN/link, per byte of payload."""
    plain = 1.0 / max(link_bps, 1.0)
    link_packed = 1.0 / max(ratio * link_bps, 1.0)
    cpu = cpus.per_byte() if cpus is not None else 0.0
    packed = max(1.0 / max(speed_bps, 1.0), link_packed + cpu)
    ok = packed <= GAIN * plain
    spare = min(cpus.spare_source, cpus.spare_here) if cpus is not None else None
    extra = {"cpu_s_per_gb": cpu * 1e9, "spare_cores": spare} if cpus is not None else {}
    if ratio < 1.0 / GAIN:
        why = f"the data shrinks only {ratio:.2f}x"
    elif not ok and cpus is not None and 1.0 / max(speed_bps, 1.0) <= GAIN * plain:
        why = (f"{ratio:.2f}x smaller saves less of the link's {link_bps / 1e6:.0f} MB/s than "
               f"compressing and decompressing cost ({cpu * 1e9:.1f} CPU-s per GB over "
               f"{spare:.1f} spare cores)")
    elif not ok:
        why = (f"the compressor ({speed_bps / 1e6:.0f} MB/s) is slower than the link "
               f"({link_bps / 1e6:.0f} MB/s) can use it")
    elif math.isinf(speed_bps):
        why = (f"{ratio:.2f}x smaller as the cache stores it beats the link's "
               f"{link_bps / 1e6:.0f} MB/s")
    else:
        why = (f"{ratio:.2f}x smaller at {speed_bps / 1e6:.0f} MB/s beats the link's "
               f"{link_bps / 1e6:.0f} MB/s" + (f", with {cpu * 1e9:.1f} CPU-s per GB over "
                                                f"{spare:.1f} spare cores" if cpus else ""))
    return Choice(ok, why, link_bps, ratio, None if math.isinf(speed_bps) else speed_bps,
                  **extra)


def measure_link(t: Transport, nbytes: int = LINK_PROBE, *, python: str = "python3",
                 sudo: bool = False, timeout: float = LINK_TIMEOUT) -> float:
    """Bytes per second from here to t's host, timed there (remote/overlay_link_probe.py) over
    the bytes after the first quarter of `nbytes` random ones: neither the session's setup
    nor what the pipes and buffers on the way held when the clock started is in it. A link so
    slow that the probe does not end within `timeout` is given as that bound (at most
    nbytes/timeout). DeployError when the probe fails otherwise."""
    try:
        answer = run_json(t, text("overlay_link_probe.py"), (str(nbytes // 4),), python=python,
                          flags=("-I",), stdin=os.urandom(nbytes), timeout=timeout, sudo=sudo,
                          what="measuring the link")
    except CommandTimeout:
        return nbytes / timeout
    return _rate(t.host, answer, nbytes)


def measure_link_down(t: Transport, nbytes: int = LINK_PROBE, *, python: str = "python3",
                      sudo: bool = False, timeout: float = LINK_TIMEOUT) -> float:
    """Bytes per second from t's host to here: the way the source's stream goes. The host
    writes `nbytes` bytes (remote/overlay_link_probe.py `send`), timed here as they arrive,
    after the first quarter (the same `Arrivals` as the host's side). Timeout and failure as
    measure_link."""
    arrivals = Arrivals(nbytes // 4)
    cmd = script_command(text("overlay_link_probe.py"), ("send", str(nbytes)), python=python,
                         flags=("-I",), sudo=sudo)  # -I: nothing of the host's folder imported
    try:
        res = t.run_stream_out(cmd, arrivals, timeout=timeout)  # type: ignore[arg-type]
    except CommandTimeout:
        return nbytes / timeout
    if not res.ok:
        raise failure(res, "measuring the link")
    return _rate(t.host, arrivals.answer(), nbytes)


def _rate(host: str, answer: dict[str, Any], nbytes: int) -> float:
    """The rate in an `Arrivals` answer of a probe of `nbytes`; DeployError for a short or
    odd one."""
    try:
        counted, received = int(answer["bytes"]), int(answer["received"])
        seconds = float(answer["seconds"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DeployError(f"{host}: measuring the link: an odd answer ({exc!r})") from exc
    if received != nbytes or counted <= 0:
        raise DeployError(f"{host}: measuring the link: {received} of {nbytes} bytes arrived")
    return counted / max(seconds, 1e-3)


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


@dataclass(frozen=True)
class Sample:
    """The source's zstd on a sample of the lane's own data."""

    zstd: bool
    ratio: float = 1.0
    speed_bps: float = math.inf  # input bytes per second, wall (zstd -T0)
    compress_cpu: float = 0.0  # CPU seconds per input byte
    decompress_cpu: float = 0.0
    cpus: int = 1
    load: float = 0.0
    why: str = ""  # where the source has a zstd that failed on the sample: what it said

    def cpus_with(self, cpus_here: int, load_here: float) -> Cpus:
        return Cpus(self.compress_cpu, self.decompress_cpu,
                    spare_cores(self.cpus, self.load), spare_cores(cpus_here, load_here))


def measure_source(t: Transport, python: str, site_packages: str,
                   files: list[tuple[str, int]], *, sudo: bool = False,
                   budget: int = SAMPLE_BYTES, flags: str = "-1") -> Sample:
    """`zstd -T0 FLAGS` (the stream's) on the source's own data: ratio, speed, CPU, cores."""
    listing = json.dumps(files).encode()
    data = run_json(t, text("overlay_sample.py"), (site_packages, str(budget), flags),
                    python=python, flags=("-I",), stdin=listing, sudo=sudo, timeout=120,
                    what="measuring compression on the source")
    n = int(data.get("bytes", 0))
    if not data.get("zstd") or n == 0:
        return Sample(bool(data.get("zstd")), why=str(data.get("why") or "")[:300])
    return Sample(True, n / max(int(data.get("compressed", n)), 1),
                  n / max(float(data.get("seconds", 0.0)), 1e-6),
                  float(data.get("cpu_seconds", 0.0)) / n,
                  float(data.get("decompress_cpu_seconds", 0.0)) / n,
                  max(int(data.get("cpus", 1)), 1), float(data.get("load", 0.0)))
