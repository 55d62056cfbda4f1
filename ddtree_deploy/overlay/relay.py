"""Pipelined transfer: source -> workstation -> every target at once, into the cache too.

The store-and-forward of fetch-then-push moved each byte over one link after the
other. Here the source's tar stream is read once; each chunk, as it arrives, goes

- to each target's receiver (its staging), byte for byte as the source sent it
  (compressed or not: no work here for it), and
- to the workstation's own reader, which hashes every file and stores it in the
  blob cache (verified before a blob exists), in the same pass.

So both links carry the data at the same time, nothing is read twice, and every
side checks the sha256 of what it keeps: the cache here, the receiver on each
target (it renames a blob into staging only when its hash matches). The apply's
own check before the swap is unchanged.

What a target needs that the cache already holds (a second target, a resumed
run) comes from the cache, in a stream of its own per target, in parallel and
bounded. Whether each stream is compressed is measured (wire.py). A target that
fails (its check, its stream, its free space) is its own failure; the others go on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ddtree_deploy.errors import DeployError
from ddtree_deploy.overlay import wire
from ddtree_deploy.overlay.blobcache import CHUNK, BlobCache
from ddtree_deploy.overlay.model import FileEntry
from ddtree_deploy.overlay.progress import NullProgress, ProgressSink
from ddtree_deploy.overlay.push import (
    StagingState,
    check_received,
    send_from_cache,
    staging_check,
)
from ddtree_deploy.overlay.transfer import (
    ZSTD_FLAGS,
    TransferReport,
    fetch,
    unique_by_sha,
)
from ddtree_deploy.remote.overlay_sample import usable_cpus  # the sample counts CPUs so too
from ddtree_deploy.remote.overlay_transfer import RECEIVE_SHELL, staging_receive
from ddtree_deploy.remote.runner import read_json
from ddtree_deploy.transport.base import Result, Transport
from ddtree_deploy.transport.command import Command

PARALLEL = 4  # targets served at once from the cache
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


@dataclass
class Destination:
    """One target: its staging folder and the contents its plan sends there."""

    label: str
    transport: Transport
    staging: str
    files: list[FileEntry]
    python: str = "python3"
    sudo: bool = False
    state: StagingState | None = None
    forwarded: TransferReport = field(default_factory=TransferReport)
    from_cache: TransferReport = field(default_factory=TransferReport)
    error: DeployError | None = None
    choice: wire.Choice | None = None
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class RelayReport:
    fetched: TransferReport
    source_choice: wire.Choice | None = None
    seconds: dict[str, float] = field(default_factory=dict)


Compress = Callable[[], wire.Choice]


class _Forward:
    """One target's receiver fed from the source's stream while the stream arrives."""

    def __init__(self, dest: Destination, need: list[FileEntry]) -> None:
        self.dest = dest
        self.need = need
        self.fd: int | None = None
        self.dead = False
        self.count = 0
        self.result: Result | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.verified: set[str] | None = None

    def start(self, compressed: bool) -> None:
        rfd, wfd = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(wfd, _F_SETPIPE_SZ, CHUNK)  # room for a chunk: smoother lockstep
        self.fd = wfd
        d = self.dest
        cmd = Command.shell(RECEIVE_SHELL, d.python, staging_receive(), d.staging,
                            "z" if compressed else "", sudo=d.sudo)
        self.dest.forwarded.compressed = compressed

        def run() -> None:
            try:
                with os.fdopen(rfd, "rb", buffering=0) as pipe_in:
                    self.result = d.transport.run_stream_in(cmd, pipe_in)
            except Exception as exc:  # the target's own failure, reported with its outcome
                self.error = exc
            finally:
                self.dead = True

        self.thread = threading.Thread(target=run, name=f"forward-{d.label}", daemon=True)
        self.thread.start()

    def feed(self, data: bytes) -> None:
        if self.dead or self.fd is None:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:  # the receiver stopped reading: it says why in its answer
            self.dead = True
            return
        self.count += len(data)

    def finish(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def outcome(self) -> set[str]:
        """The contents the receiver verified (once joined); a failure is the destination's."""
        if self.verified is not None:
            return self.verified
        self.finish()
        if self.thread is not None:
            self.thread.join()
        d = self.dest
        d.forwarded.wire = self.count
        self.verified = set()
        if self.thread is None:  # the stream never started
            return self.verified
        try:
            if isinstance(self.error, DeployError):
                raise self.error
            if self.error is not None:
                raise DeployError(f"{d.transport.host}: the stream to {d.staging} failed: "
                                  f"{self.error}")
            assert self.result is not None
            answer = read_json(self.result, "the staging receiver", answers=None)
            ok = answer.get("ok")
            self.verified = {str(s) for s in ok} if isinstance(ok, list) else set()
            check_received(d.transport.host, d.staging, self.need, answer)
        except DeployError as exc:
            d.error = d.error or exc
            return self.verified
        d.forwarded.files = len(self.need)
        d.forwarded.payload = sum(e.size for e in self.need)
        return self.verified


def _check_all(dests: list[Destination], parallel: int) -> None:
    def one(d: Destination) -> None:
        t0 = time.monotonic()
        try:
            d.state = staging_check(d.transport, d.staging, unique_by_sha(d.files),
                                    python=d.python, sudo=d.sudo)
        except DeployError as exc:
            d.error = exc
        d.seconds["staging_check"] = time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(dests)))) as pool:
        list(pool.map(one, dests))


def _needs(d: Destination) -> list[FileEntry]:
    present = d.state.present if d.state is not None else set()
    return [e for e in unique_by_sha(d.files) if e.sha256 not in present]


def relay(
    source: Transport,
    site_packages: str,
    dests: list[Destination],
    cache: BlobCache,
    progress: ProgressSink | None = None,
    *,
    python: str = "python3",
    sudo: bool = False,
    compress: str = "auto",
    link_bps: float | None = None,
    parallel: int = PARALLEL,
) -> RelayReport:
    """Bring every destination's staging up to its files; failures recorded per destination.

    compress: "auto" (measured), "always" or "never". link_bps: the link's rate when
    known (else measured). Raises only for what fails every target (the source).
    """
    progress = progress or NullProgress()
    t0 = time.monotonic()
    _check_all(dests, parallel)
    timings: dict[str, float] = {"staging_checks": time.monotonic() - t0}
    live = [d for d in dests if d.error is None]
    for d in live:
        need = sum(e.size for e in _needs(d))
        if d.state is not None and d.state.free is not None and d.state.free < need:
            d.error = DeployError(f"{d.transport.host}: {d.staging} has {d.state.free} bytes "
                                  f"free, the staging needs {need}")
    live = [d for d in live if d.error is None]
    wanted = unique_by_sha(e for d in dests for e in d.files)
    from_source = [e for e in wanted if not cache.has(e.sha256)]
    source_shas = {e.sha256 for e in from_source}
    forwards = [_Forward(d, [e for e in _needs(d) if e.sha256 in source_shas]) for d in live]
    forwards = [f for f in forwards if f.need]
    report = RelayReport(TransferReport(skipped=len(wanted) - len(from_source)))
    if from_source:
        t1 = time.monotonic()
        choice = _source_choice(source, site_packages, from_source, forwards, python, sudo,
                                compress, link_bps)
        report.source_choice = choice
        timings["measure_source"] = time.monotonic() - t1
        tasks = [progress.begin(f.dest.transport.host, "push (streamed)",
                                sum(e.size for e in f.need)) for f in forwards]
        t2 = time.monotonic()
        try:
            report.fetched = fetch(source, site_packages, from_source, cache, progress,
                                   python=python, compress=choice.compress, sudo=sudo,
                                   forward=forwards, also=tasks)
        finally:
            for f, task in zip(forwards, tasks, strict=True):
                f.outcome()
                progress.end(task)
        timings["stream"] = time.monotonic() - t2
    got = {id(f.dest): f.outcome() for f in forwards}
    rest = [d for d in live if d.error is None]
    t3 = time.monotonic()

    def from_cache(d: Destination) -> None:
        need = [e for e in _needs(d) if e.sha256 not in got.get(id(d), set())]
        if not need:
            return
        t = time.monotonic()
        try:
            d.choice = _cache_choice(d, need, cache, compress, link_bps)
            d.from_cache = send_from_cache(
                d.transport, d.staging, need, cache, progress, python=d.python,
                compress=d.choice.compress, sudo=d.sudo)
        except DeployError as exc:
            d.error = exc
        d.seconds["from_cache"] = time.monotonic() - t

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(rest) or 1))) as pool:
        list(pool.map(from_cache, rest))
    timings["from_cache"] = time.monotonic() - t3
    report.seconds = {k: round(v, 3) for k, v in timings.items()}
    return report


def _forced(compress: str, without_zstd: list[str]) -> wire.Choice | None:
    """The choice made without measuring, or None: `--compress never`; plain toward a target
    without zstd (it could not read a compressed stream, even if asked); `--compress always`."""
    if compress == "never":
        return wire.Choice(False, "--compress never")
    if without_zstd:
        return wire.Choice(False, f"no zstd on {', '.join(without_zstd)}"
                           + (" (--compress always not honoured)" if compress == "always" else ""))
    if compress == "always":
        return wire.Choice(True, "--compress always")
    return None


def _source_choice(source: Transport, site_packages: str, files: list[FileEntry],
                   forwards: list[_Forward], python: str, sudo: bool, compress: str,
                   link_bps: float | None) -> wire.Choice:
    forced = _forced(compress, [f.dest.label for f in forwards if f.dest.state is not None
                                and not f.dest.state.zstd])
    if forced is not None:
        return forced
    sample = wire.measure_source(source, python, site_packages,
                                 [(e.path, e.size) for e in files], sudo=sudo, flags=ZSTD_FLAGS)
    if not sample.zstd:
        why = f" ({sample.why})" if sample.why else ""
        return wire.Choice(False, f"no usable zstd on {source.host}{why}")
    try:
        link = link_bps or wire.measure_link_down(source, python=python, sudo=sudo)
    except DeployError as exc:  # the choice's input only: the stream goes plain, saying why
        return wire.Choice(False, f"the link to {source.host} was not measured: {exc}")
    here = sample.cpus_with(usable_cpus(), os.getloadavg()[0])
    return wire.choose(link, sample.ratio, sample.speed_bps, here)


def _cache_choice(d: Destination, need: list[FileEntry], cache: BlobCache, compress: str,
                  link_bps: float | None) -> wire.Choice:
    forced = _forced(compress, [d.transport.host] if d.state is not None and not d.state.zstd
                     else [])
    if forced is not None:
        return forced
    # a compressed stream sends the cache's frames as stored: the ratio is theirs, and no
    # compressor runs here (the target's `zstd -d` outruns any link this tool meets)
    payload = sum(e.size for e in need)
    stored = sum(cache.stored_size(e.sha256) for e in need)
    ratio = payload / max(stored, 1)
    try:
        link = link_bps or wire.measure_link(d.transport, python=d.python, sudo=d.sudo)
    except DeployError as exc:
        return wire.Choice(False, f"the link to {d.transport.host} was not measured: {exc}")
    return wire.choose(link, ratio, float("inf"))
