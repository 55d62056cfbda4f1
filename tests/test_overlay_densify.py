"""The blob cache recompressed harder after a transfer (overlay/densify.py).

A recompressed blob serves the same bytes (read here, and sent as its stored frame to a
target's staging), a damaged blob is dropped rather than recompressed, a second
recompressor leaves the cache alone while one holds the lock, and a kill at any point
leaves every blob whole and verified.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddtree_deploy.overlay import densify
from ddtree_deploy.overlay.blobcache import STORE_LEVEL, BlobCache
from ddtree_deploy.overlay.model import FileEntry
from ddtree_deploy.overlay.push import send_from_cache
from ddtree_deploy.transport import LocalTransport

pytestmark = pytest.mark.integration  # the recompressor in a process, a receiver's shell

MiB = 1024 * 1024
STAGE = "v/.ddtree-deploy/overlay/staging/p1"


def _contents(seed: int, n: int, size: int) -> list[bytes]:
    """Compressible but not trivially: random words from a small vocabulary, and one random."""
    rng = random.Random(seed)
    words = [rng.randbytes(rng.randint(3, 12)) for _ in range(300)]
    out = []
    for i in range(n):
        parts: list[bytes] = []
        total = 0
        while total < size:
            parts.append(rng.choice(words))
            total += len(parts[-1])
        out.append(b"".join(parts)[: size + i])
    out.append(rng.randbytes(size))  # incompressible: kept as it is, marked
    out.append(b"")
    return out


def _filled(root: Path, contents: list[bytes]) -> tuple[BlobCache, dict[str, bytes]]:
    cache = BlobCache(root)
    by_sha = {}
    for data in contents:
        sha = hashlib.sha256(data).hexdigest()
        cache.put(sha, io.BytesIO(data), len(data), STORE_LEVEL)  # as a stream stores it
        by_sha[sha] = data
    return cache, by_sha


def _all_valid(cache: BlobCache, by_sha: dict[str, bytes]) -> None:
    for sha, data in by_sha.items():
        assert cache.has(sha), sha
        with cache.open(sha) as fh:
            assert fh.read() == data
        assert cache.size(sha) == len(data)


def test_recompressed_cache_serves_the_same_bytes(tmp_path: Path) -> None:
    cache, by_sha = _filled(tmp_path / "cache", _contents(1, 4, 2 * MiB))
    before = {sha: cache.stored_size(sha) for sha in by_sha}
    assert not any(cache.is_dense(sha) for sha in by_sha)

    report = densify.densify_all(cache)

    assert all(cache.is_dense(sha) for sha in by_sha)
    assert report.blobs >= 4 and report.damaged == 0 and report.after < report.before
    shrunk = [sha for sha in by_sha if cache.stored_size(sha) < before[sha]]
    assert len(shrunk) >= 4  # the compressible ones
    _all_valid(cache, by_sha)
    assert not any((cache.root / "tmp").iterdir())
    assert densify.fast_blobs(cache) == []
    again = densify.densify_all(cache)  # nothing left to do
    assert (again.blobs, again.kept, again.before) == (0, 0, 0)

    # a target with zstd gets the dense frames as stored: fewer bytes, the same contents
    need = [FileEntry(path=f"f{i}", sha256=sha, size=len(data))
            for i, (sha, data) in enumerate(by_sha.items())]
    staging = tmp_path / STAGE
    sent = send_from_cache(LocalTransport(), str(staging), need, cache, python=sys.executable)
    assert sent.compressed and sent.files == len(need)
    assert sent.wire < sum(before.values())  # denser than what the stream had stored
    for sha, data in by_sha.items():
        assert (staging / "blobs" / sha).read_bytes() == data


def test_a_damaged_blob_is_dropped_not_recompressed(tmp_path: Path) -> None:
    cache, by_sha = _filled(tmp_path / "cache", _contents(2, 2, MiB))
    bad = next(iter(by_sha))
    path = cache.path_for(bad)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    report = densify.densify_all(cache)

    assert report.damaged == 1 and not cache.has(bad)
    del by_sha[bad]
    _all_valid(cache, by_sha)
    assert all(cache.is_dense(sha) for sha in by_sha)


def test_a_second_recompressor_leaves_the_cache_alone(tmp_path: Path) -> None:
    cache, by_sha = _filled(tmp_path / "cache", _contents(3, 2, MiB))
    with (cache.root / densify.LOCK).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert densify.main([str(cache.root)]) == 0
        assert not any(cache.is_dense(sha) for sha in by_sha)
    assert densify.main([str(cache.root)]) == 0
    assert all(cache.is_dense(sha) for sha in by_sha)
    assert densify.main([str(tmp_path / "gone")]) == 0 and not (tmp_path / "gone").exists()


def test_a_kill_at_any_point_leaves_a_valid_cache(tmp_path: Path) -> None:
    """20 trials: the detached process killed (SIGKILL) once it has begun, at a random moment."""
    rng = random.Random(7)
    cache, by_sha = _filled(tmp_path / "cache", _contents(4, 10, MiB))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    mid_way = 0
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-m", "ddtree_deploy.overlay.densify",
                                 str(cache.root)], env=env)
        while proc.poll() is None and not any((cache.root / "tmp").iterdir()):
            time.sleep(0.002)  # until it writes its first temporary
        time.sleep(rng.uniform(0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = len(densify.fast_blobs(cache))
        mid_way += left > 0
        reopened = BlobCache(cache.root)  # removes the killed writer's temporary
        assert not any((reopened.root / "tmp").iterdir())
        _all_valid(reopened, by_sha)
        for p in (reopened.root / "sha256").glob("*/*.zst"):  # fast blobs back, for the next trial
            os.chmod(p, 0o644)
    assert mid_way > 0  # some kills did land part-way through
    assert densify.main([str(cache.root)]) == 0
    assert densify.fast_blobs(cache) == []
    _all_valid(cache, by_sha)
