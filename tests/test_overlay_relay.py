"""The pipelined relay: source -> workstation -> several targets at once, the cache filled on
the way; compression chosen by measurement; a failed target is its own.

Over LocalTransport (the "hosts" are folders of this machine) and one real loopback sshd.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sys
from pathlib import Path

import pytest

from ddtree_deploy.errors import TransportError
from ddtree_deploy.overlay import wire
from ddtree_deploy.overlay.blobcache import STORE_LEVEL, BlobCache, level_for
from ddtree_deploy.overlay.model import FileEntry
from ddtree_deploy.overlay.progress import CountingProgress
from ddtree_deploy.overlay.relay import Destination, relay
from ddtree_deploy.remote.overlay_transfer import staging_receive
from ddtree_deploy.transport import LocalTransport

PY = sys.executable
MiB = 1024 * 1024


def _venv(root: Path, compressible: bool) -> tuple[Path, list[FileEntry]]:
    sp = root / "lib" / "python3.11" / "site-packages"
    (sp / "pkg").mkdir(parents=True)
    rng = random.Random(7)
    files = {"pkg/a.so": rng.randbytes(5 * MiB + 11), "pkg/b.py": b"x = 1\n",
             "pkg/empty": b""}
    if compressible:
        files = {k: (b"kernel-" * (len(v) // 7 + 1))[:len(v)] for k, v in files.items()}
    entries = []
    for rel, data in files.items():
        (sp / rel).write_bytes(data)
        entries.append(FileEntry(path=rel, sha256=hashlib.sha256(data).hexdigest(),
                                 size=len(data)))
    return sp, entries


def _dest(tmp: Path, name: str, files: list[FileEntry]) -> Destination:
    return Destination(label=f"{name}:/v", transport=LocalTransport(host=name),
                       staging=str(tmp / name / ".ddtree-deploy/overlay/staging/p1"),
                       files=files, python=PY)


def _staged(d: Destination) -> dict[str, str]:
    blobs = Path(d.staging) / "blobs"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in blobs.iterdir()}


def test_cold_relay_streams_to_every_target_and_fills_the_cache(tmp_path: Path) -> None:
    sp, files = _venv(tmp_path / "src", compressible=False)
    cache = BlobCache(tmp_path / "cache")
    dests = [_dest(tmp_path, n, files) for n in ("t1", "t2", "t3")]
    progress = CountingProgress()
    rep = relay(LocalTransport(host="src"), str(sp), dests, cache, progress, python=PY)
    shas = {f.sha256 for f in files}
    assert rep.fetched.files == len(shas) and all(cache.verify(s) for s in shas)
    for d in dests:
        assert d.error is None
        staged = _staged(d)
        assert set(staged) == shas and all(k == v for k, v in staged.items())
        assert d.forwarded.files == len(shas) and d.from_cache.files == 0  # one pass
    pushes = [t for t in progress.tasks.values() if t["what"] == "push (streamed)"]
    assert len(pushes) == 3 and all(t["done"] == t["total"] and t["ended"] for t in pushes)
    # warm: a new target gets everything from the cache, the source sends nothing
    late = _dest(tmp_path, "t4", files)
    before = [_dest(tmp_path, n, files) for n in ("t1", "t2", "t3")]
    again = relay(LocalTransport(host="src"), str(sp), [late, *before], cache, python=PY)
    assert again.fetched.files == 0 and again.fetched.wire == 0
    assert late.from_cache.files == len(shas) and set(_staged(late)) == shas
    assert all(d.from_cache.files == 0 and d.forwarded.files == 0 for d in before)  # staged


def test_a_failed_target_is_its_own(tmp_path: Path) -> None:
    sp, files = _venv(tmp_path / "src", compressible=False)
    cache = BlobCache(tmp_path / "cache")
    good = _dest(tmp_path, "good", files)
    bad = _dest(tmp_path, "bad", files)
    bad.python = "/no/python"
    rep = relay(LocalTransport(host="src"), str(sp), [bad, good], cache, python=PY)
    assert bad.error is not None and "staging check failed" in bad.error.message
    assert good.error is None and set(_staged(good)) == {f.sha256 for f in files}
    assert rep.fetched.files == len({f.sha256 for f in files})


class _CutOff(LocalTransport):
    """A target whose connection drops after the first MiB of the stream."""

    def run_stream_in(self, cmd, src, *, timeout=None):
        if staging_receive() in cmd.argv:
            src.read(MiB)
            raise TransportError(f"{self.host}: connection lost")
        return super().run_stream_in(cmd, src, timeout=timeout)


def test_a_target_whose_stream_breaks_off_does_not_stop_the_others(tmp_path: Path) -> None:
    sp, files = _venv(tmp_path / "src", compressible=False)
    cache = BlobCache(tmp_path / "cache")
    good, cut = _dest(tmp_path, "good", files), _dest(tmp_path, "cut", files)
    cut.transport = _CutOff(host="cut")
    relay(LocalTransport(host="src"), str(sp), [cut, good], cache, python=PY)
    assert cut.error is not None and "connection lost" in cut.error.message
    assert good.error is None and set(_staged(good)) == {f.sha256 for f in files}
    assert all(cache.verify(f.sha256) for f in files)


def test_choice_flips_between_compressible_and_incompressible_data() -> None:
    rng = random.Random(3)
    random_data = [rng.randbytes(2 * MiB) for _ in range(4)]
    text_data = [(b"cuda kernel %d " % i) * 150_000 for i in range(4)]
    link = 125e6  # 1 Gbit/s
    r_ratio, r_speed = wire.measure_local(random_data)
    t_ratio, t_speed = wire.measure_local(text_data)
    assert r_ratio < 1.05 and t_ratio > 5
    assert not wire.choose(link, r_ratio, r_speed).compress
    assert wire.choose(link, t_ratio, t_speed).compress
    # the same compressible data over a link faster than the compressor: not worth it
    assert not wire.choose(t_speed * 10, t_ratio, t_speed).compress


# Run E (benchmarks/RESULTS.md): the cold stream's auto choice in the lab, all hosts on the same
# 2 cores (load 2-5): the source's sample, the link probe, and the CPU the stream's own zstd
# (8.46 CPU-s) and the target's zstd -d (2.81 CPU-s) took for the lane's 1.2486 GB.
LANE = 1.2486e9
RUN_E = {"link_bps": 23.9e6, "ratio": 1.559, "speed_bps": 123.4e6}
RUN_E_CPU = {"compress_cpu": 8.46 / LANE, "decompress_cpu": 2.81 / LANE}


def test_choice_flips_with_the_cores_the_ends_can_spare() -> None:
    busy = wire.Cpus(**RUN_E_CPU, spare_source=wire.spare_cores(2, 3.1),
                     spare_here=wire.spare_cores(2, 3.1))
    idle = wire.Cpus(**RUN_E_CPU, spare_source=wire.spare_cores(16, 0.2),
                     spare_here=wire.spare_cores(8, 0.4))
    assert busy.spare_source == 1.0 and idle.spare_source > 10
    # the old rule (CPU taken as free) compressed, and the plain stream was faster
    assert wire.choose(**RUN_E).compress
    no = wire.choose(**RUN_E, cpus=busy)
    assert not no.compress and "CPU-s per GB" in no.reason and no.spare_cores == 1.0
    yes = wire.choose(**RUN_E, cpus=idle)
    assert yes.compress and yes.cpu_s_per_gb is not None and yes.cpu_s_per_gb < 1.0
    # a link twice as fast: even idle ends do not make 1.56x worth it; a slow one: busy ends do
    assert not wire.choose(**{**RUN_E, "link_bps": 2 * RUN_E["speed_bps"]}, cpus=idle).compress
    assert wire.choose(**{**RUN_E, "link_bps": 8e6}, cpus=busy).compress


def test_choice_on_busy_ends_still_flips_between_compressible_and_random_data() -> None:
    rng = random.Random(4)
    random_data = [rng.randbytes(2 * MiB) for _ in range(4)]
    text_data = [(b"cuda kernel %d " % i) * 150_000 for i in range(4)]
    link = 20e6  # 160 Mbit/s
    for data, shrinks in ((text_data, True), (random_data, False)):
        ratio, speed = wire.measure_local(data)
        # busy ends, and decompressing taken as dear as compressing: text still pays
        cpus = wire.Cpus(1 / speed, 1 / speed, spare_source=1.0, spare_here=1.0)
        assert wire.choose(link, ratio, speed, cpus).compress is shrinks


@pytest.mark.parametrize("compressible", [True, False])
def test_the_source_sample_measures_ratio_cpu_and_cores(tmp_path: Path,
                                                        compressible: bool) -> None:
    if shutil.which("zstd") is None:
        pytest.skip("zstd is needed on the source")
    sp, files = _venv(tmp_path / "src", compressible=compressible)
    sample = wire.measure_source(LocalTransport(host="src"), PY, str(sp),
                                 [(e.path, e.size) for e in files], flags="-1 --long=27")
    assert sample.zstd and sample.cpus == len(os.sched_getaffinity(0))
    assert (sample.ratio > 5) if compressible else (sample.ratio < 1.05)
    assert sample.compress_cpu > 0 and sample.decompress_cpu >= 0 and sample.load >= 0
    cpus = sample.cpus_with(2, 0.5)
    assert cpus.spare_here == 1.0 and cpus.spare_source >= 1.0


@pytest.mark.parametrize("compressible", [True, False])
def test_source_stream_compression_is_measured(tmp_path: Path, compressible: bool) -> None:
    sp, files = _venv(tmp_path / "src", compressible=compressible)
    cache = BlobCache(tmp_path / "cache")
    d = _dest(tmp_path, "t", files)
    # a 160 Mbit/s link: any compressor keeps ahead of it; only the data decides
    rep = relay(LocalTransport(host="src"), str(sp), [d], cache, python=PY, link_bps=20e6)
    assert rep.source_choice is not None and rep.source_choice.ratio is not None
    assert rep.source_choice.compress is compressible, rep.source_choice
    assert rep.fetched.compressed is compressible and d.forwarded.compressed is compressible
    assert set(_staged(d)) == {f.sha256 for f in files}
    if compressible:
        assert rep.fetched.wire < rep.fetched.payload / 5


def test_cache_level_is_measured_per_blob() -> None:
    rng = random.Random(5)
    assert level_for(rng.randbytes(MiB), 1) == STORE_LEVEL
    assert level_for(b"abc" * 400_000, 1) == 1
    assert level_for(b"tiny", 1) == 1  # too short to measure: the cache's level


def test_a_zstd_that_fails_on_the_streams_flags_counts_as_none(tmp_path: Path) -> None:
    if shutil.which("zstd") is None:
        pytest.skip("zstd is needed on the source")
    sp, files = _venv(tmp_path / "src", compressible=True)
    sample = wire.measure_source(LocalTransport(host="src"), PY, str(sp),
                                 [(e.path, e.size) for e in files], flags="-1 --no-such-flag")
    assert not sample.zstd and sample.ratio == 1.0  # not a huge ratio from an empty output
    assert sample.why  # what zstd said


def test_compress_always_is_not_honoured_for_a_target_without_zstd(tmp_path: Path) -> None:
    from ddtree_deploy.overlay import relay as relay_mod
    from ddtree_deploy.overlay.push import StagingState

    sp, files = _venv(tmp_path / "src", compressible=True)
    cache = BlobCache(tmp_path / "cache")
    bare, full = _dest(tmp_path, "bare", files), _dest(tmp_path, "full", files)
    bare.state = StagingState(set(), zstd=False, free=None)
    full.state = StagingState(set(), zstd=True, free=None)

    def source(dest: Destination, compress: str) -> wire.Choice:
        return relay_mod._source_choice(LocalTransport(host="src"), str(sp), files,
                                        [relay_mod._Forward(dest, files)], PY, False, compress,
                                        20e6)

    refused = source(bare, "always")
    assert not refused.compress and "no zstd on bare:/v" in refused.reason
    assert "--compress always not honoured" in refused.reason
    assert source(full, "always").compress and not source(full, "never").compress
    from_cache = relay_mod._cache_choice(bare, files, cache, "always", 20e6)
    assert not from_cache.compress and "not honoured" in from_cache.reason
    assert relay_mod._cache_choice(full, files, cache, "always", 20e6).compress
