"""The blob cache recompressed harder, off the critical path.

While a transfer streams, the cache writes each blob at a fast level (blobcache.STORE_LEVEL:
nearly a copy; CPU is the scarce thing then). A later target is served from the cache in
one hop, and where it has zstd the cache's own frames go on the wire as they are stored
(transfer.py): so a denser frame is fewer bytes for every later target, at no CPU cost
here when it is sent. This module makes the frames denser after the command that filled
the cache: a detached process (`spawn`), at idle CPU priority (SCHED_IDLE, else nice 19),
one thread, one at a time per cache (a lock file; a second one exits at once).

Per blob: the stored frame is read back through the cache's verifying reader (the old
blob's sha256 checked), compressed into ``tmp/`` as ONE frame at zstd LEVEL with a
2^WINDOW_LOG window and long-distance matching (content size and zstd's checksum in it),
that new file decompressed again and its sha256 and size checked, fsync-ed, given mode
DENSE_MODE and renamed over the old blob (atomic). Killed at any point, each blob is its
old frame or its new one, both whole and verified; a temporary left behind is removed by
the next cache opened on the folder once its writer is gone. A frame that would not be
smaller is not replaced, only marked (so it is not tried again). A damaged blob is removed
(the next overlay fetches it again). The measurements behind LEVEL: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zstandard

from ddtree_deploy.overlay.blobcache import CHUNK, DENSE_MODE, BlobCache, IntegrityError

LEVEL = 3
WINDOW_LOG = 27  # what the receiver's `zstd -d --long=27` accepts
LOCK = "densify.lock"


@dataclass
class DensifyReport:
    blobs: int = 0  # recompressed (replaced)
    kept: int = 0  # a denser frame was not smaller: marked, not replaced
    damaged: int = 0  # removed
    before: int = 0  # stored bytes of the blobs looked at, before
    after: int = 0  # and after
    seconds: float = 0.0


def _params() -> zstandard.ZstdCompressionParameters:
    return zstandard.ZstdCompressionParameters.from_level(
        LEVEL, window_log=WINDOW_LOG, enable_ldm=True, write_content_size=True,
        write_checksum=True, threads=0)


def _check_frame(path: Path, sha: str, size: int) -> None:
    """IntegrityError unless `path` decompresses to `size` bytes of sha256 `sha`."""
    digest = hashlib.sha256()
    count = 0
    dctx = zstandard.ZstdDecompressor(max_window_size=1 << WINDOW_LOG)
    try:
        with path.open("rb") as raw, dctx.stream_reader(raw, read_size=CHUNK) as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
                count += len(chunk)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"the recompressed blob {sha} does not decompress: {exc}") from exc
    if count != size or digest.hexdigest() != sha:
        raise IntegrityError(f"the recompressed blob {sha} differs from its content")


def densify_one(cache: BlobCache, sha: str, report: DensifyReport) -> None:
    """Recompress one blob written at the fast level (see the module's text)."""
    final = cache.path_for(sha)
    try:
        st = final.stat()
    except FileNotFoundError:
        return
    if not st.st_mode & 0o222:
        return  # dense already
    tmp = cache.root / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        size = cache.size(sha)
        with cache.open(sha) as src, tmp.open("wb") as out:
            comp = zstandard.ZstdCompressor(compression_params=_params()).compressobj(size=size)
            while chunk := src.read(CHUNK):
                out.write(comp.compress(chunk))
            out.write(comp.flush())
            out.flush()
            os.fsync(out.fileno())
        _check_frame(tmp, sha, size)
        report.before += st.st_size
        new = tmp.stat().st_size
        if new < st.st_size:
            os.chmod(tmp, DENSE_MODE)
            os.replace(tmp, final)
            report.blobs += 1
            report.after += new
        else:
            os.chmod(final, DENSE_MODE)
            report.kept += 1
            report.after += st.st_size
    except (IntegrityError, zstandard.ZstdError):
        cache.remove(sha)  # the old blob was damaged (or could not be read back)
        report.damaged += 1
    except FileNotFoundError:
        pass  # removed meanwhile
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def fast_blobs(cache: BlobCache) -> list[str]:
    """The blobs still at the fast level, largest first (they gain the most)."""
    found = []
    for p in (cache.root / "sha256").glob("*/*.zst"):
        with contextlib.suppress(FileNotFoundError):
            st = p.stat()
            if st.st_mode & 0o222:
                found.append((st.st_size, p.stem))
    return [sha for _, sha in sorted(found, reverse=True)]


def densify_all(cache: BlobCache, stop: Callable[[], bool] | None = None) -> DensifyReport:
    """Recompress every fast blob, one after the other; `stop` is asked between blobs."""
    report = DensifyReport()
    t0 = time.monotonic()
    for sha in fast_blobs(cache):
        if stop is not None and stop():
            break
        densify_one(cache, sha, report)
    report.seconds = round(time.monotonic() - t0, 3)
    return report


def _idle_priority() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)


def spawn(root: Path) -> int:
    """Start the recompression of the cache at `root` in a detached process; its PID."""
    proc = subprocess.Popen(  # this interpreter, this module, a path
        [sys.executable, "-m", "ddtree_deploy.overlay.densify", str(root)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)
    return proc.pid


def main(argv: list[str]) -> int:
    """`python -m ddtree_deploy.overlay.densify ROOT`: exits 0 at once if one runs there."""
    root = Path(argv[0])
    if not (root / "sha256").is_dir():
        return 0  # no cache there (any more): nothing to create
    with (root / LOCK).open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # another one is at it
        _idle_priority()
        densify_all(BlobCache(root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
