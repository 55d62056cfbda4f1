"""The workstation's content-addressed blob cache: every file content once, by sha256.

Layout: ``<root>/sha256/ab/<hex>.zst`` (zstd frames, content size in the header),
written through ``<root>/tmp/<pid>-<random>`` and renamed into place only after the
sha256 of the bytes written matches the name and they are on disk: an fsync of its own
(`put`), or, for a stream's blobs (`BackgroundWriter`), one syncfs for a batch of them
before any is renamed (remote/overlay_durable.py says why that order is as safe across a
power loss). So a blob that exists is complete and verified; a crash mid-write leaves at
most temporary files, which the next cache opened on the folder removes once their writer
process is gone.

Memory stays bounded: data moves in 1 MiB chunks; zstd keeps a fixed window. Each
blob's level is measured on its first chunk: data that does not shrink is stored at
a level that is nearly a copy (CPU is the scarce thing while a transfer streams).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import queue
import re
import threading
import uuid
from pathlib import Path
from typing import BinaryIO

import zstandard

from ddtree_deploy import xdg
from ddtree_deploy.errors import DeployError
from ddtree_deploy.localproc import pid_alive
from ddtree_deploy.remote.overlay_durable import Batch

CHUNK = 1024 * 1024
LEVEL = 1  # per-blob level on disk: written while the bytes stream through, so fast
STORE_LEVEL = -5  # for contents that do not shrink (most CUDA 13 libraries): near a copy;
# also what a stream writes with (benchmarks/RESULTS.md: level 1 cost 6.8 CPU-s of 1.2 GB)
TRIAL = 64 * 1024  # a first chunk at least this long is test-compressed to pick the level


def level_for(first_chunk: bytes, level: int) -> int:
    """`level`, or STORE_LEVEL when the first chunk shrinks less than 10% at it (measured)."""
    if len(first_chunk) < TRIAL:
        return level
    trial = zstandard.ZstdCompressor(level=level).compress(first_chunk[:4 * TRIAL])
    return level if len(trial) * 1.1 <= min(len(first_chunk), 4 * TRIAL) else STORE_LEVEL

FAST_MODE = 0o644  # a blob as the stream wrote it; densify.py's denser frames are DENSE_MODE
DENSE_MODE = 0o444
_HEX = re.compile(r"[0-9a-f]{64}\Z")


class IntegrityError(DeployError):
    """Bytes did not match the sha256 (or size) they were announced with."""


def check_sha(sha256: str) -> str:
    """`sha256` lower-cased, or IntegrityError when it is not 64 hex digits."""
    sha = sha256.lower()
    if not _HEX.match(sha):
        raise IntegrityError(f"not a sha256 hex digest: {sha256!r}")
    return sha


def default_root() -> Path:
    return xdg.cache_dir() / "blobs"


class BlobCache:
    """Blobs by sha256, zstd-compressed on disk, verified on the way in and out."""

    def __init__(self, root: Path | None = None, *, level: int = LEVEL,
                 read_only: bool = False) -> None:
        """read_only: only asked what it holds (a dry run): nothing made, nothing swept."""
        self.root = Path(root) if root is not None else default_root()
        self.level = level
        if read_only:
            return
        try:
            (self.root / "sha256").mkdir(parents=True, exist_ok=True)
            (self.root / "tmp").mkdir(exist_ok=True)
        except OSError as exc:
            raise DeployError(f"cannot create the blob cache at {self.root}: {exc}") from exc
        self.remove_stale()

    # -- naming ---------------------------------------------------------------

    def path_for(self, sha256: str) -> Path:
        sha = check_sha(sha256)
        return self.root / "sha256" / sha[:2] / f"{sha}.zst"

    def has(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def missing(self, shas: list[str]) -> list[str]:
        """The shas (deduplicated, order kept) that the cache lacks."""
        seen: set[str] = set()
        out: list[str] = []
        for sha in shas:
            if sha not in seen and not self.has(sha):
                out.append(sha)
            seen.add(sha)
        return out

    def size(self, sha256: str) -> int:
        """The uncompressed size of a blob (from its zstd frame header)."""
        with self.path_for(sha256).open("rb") as fh:
            header = fh.read(18)
        size = zstandard.frame_content_size(header)
        if size < 0:
            raise IntegrityError(f"blob {sha256} has no content size in its header")
        return int(size)

    def is_dense(self, sha256: str) -> bool:
        """True once densify.py recompressed the blob (its file has no write bit)."""
        return not self.path_for(sha256).stat().st_mode & 0o222

    def stored_size(self, sha256: str) -> int:
        """Bytes the blob takes on disk: what a stream of its stored frame sends."""
        return self.path_for(sha256).stat().st_size

    def stored_bytes(self) -> int:
        """Bytes the blobs take on disk (compressed)."""
        return sum(p.stat().st_size for p in (self.root / "sha256").glob("*/*.zst"))

    # -- writing --------------------------------------------------------------

    def put(self, sha256: str, src: BinaryIO, size: int | None = None,
            level: int | None = None, batch: Batch | None = None) -> int:
        """Store `src` (read to EOF, or `size` bytes) as blob `sha256`; returns bytes read.

        Raises IntegrityError (and stores nothing) when the content's sha256 or size
        differs. A blob that already exists is not rewritten; `src` is still read so
        the caller's stream stays in step. With `batch`, the verified blob waits there,
        unsynced, under its temporary name: it exists once the batch is flushed.
        """
        sha = check_sha(sha256)
        final = self.path_for(sha)
        if final.is_file():
            return _drain(src, size)
        tmp = self.root / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        digest = hashlib.sha256()
        count = 0
        handed = False
        try:
            with tmp.open("wb") as raw:
                comp = None
                left = size
                while left is None or left > 0:
                    chunk = src.read(CHUNK if left is None else min(CHUNK, left))
                    if not chunk:
                        break
                    if comp is None:  # the level measured on the first chunk
                        want = self.level if level is None else level
                        cctx = zstandard.ZstdCompressor(level=level_for(chunk, want),
                                                        write_content_size=True)
                        comp = cctx.compressobj(size=-1 if size is None else size)
                    digest.update(chunk)
                    raw.write(comp.compress(chunk))
                    count += len(chunk)
                    if left is not None:
                        left -= len(chunk)
                if size is not None and count != size:
                    raise IntegrityError(f"blob {sha}: stream ended after {count} of {size} bytes")
                if comp is None:  # empty content
                    comp = zstandard.ZstdCompressor(level=self.level,
                                                    write_content_size=True).compressobj(size=0)
                raw.write(comp.flush())
                raw.flush()
                if batch is None:
                    os.fsync(raw.fileno())
                else:
                    batch.written(raw.fileno())  # to disk from now on; the batch waits for it
                os.fchmod(raw.fileno(), FAST_MODE)  # written at the fast level (densify.py)
                stored = raw.tell()
            got = digest.hexdigest()
            if got != sha:
                raise IntegrityError(f"content does not match its sha256: want {sha}, got {got}")
            if batch is not None:
                batch.add(str(tmp), stored, lambda: self._publish(tmp, final))
                handed = True
            else:
                self._publish(tmp, final)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"blob {sha}: could not compress: {exc}") from exc
        except OSError as exc:
            raise DeployError(f"cannot write blob {sha} in {self.root}: {exc}") from exc
        finally:
            if not handed:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        return count

    @staticmethod
    def _publish(tmp: Path, final: Path) -> None:
        """The verified, durable `tmp` becomes the blob `final` (an atomic rename)."""
        final.parent.mkdir(exist_ok=True)
        os.replace(tmp, final)

    def put_bytes(self, data: bytes) -> str:
        """Store `data`; returns its sha256."""
        sha = hashlib.sha256(data).hexdigest()
        self.put(sha, io.BytesIO(data), len(data))
        return sha

    def put_file(self, path: Path) -> str:
        """Store a local file (hashed first, then streamed in); returns its sha256."""
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
            fh.seek(0)
            self.put(digest.hexdigest(), fh)
        return digest.hexdigest()

    def remove(self, sha256: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path_for(sha256).unlink()

    def remove_stale(self) -> int:
        """Delete temporary files whose writer process is gone; returns how many."""
        removed = 0
        for tmp in (self.root / "tmp").iterdir():
            pid_text = tmp.name.split("-", 1)[0]
            if pid_text.isdecimal() and int(pid_text) > 0 and pid_alive(int(pid_text)):
                continue  # its writer (maybe this process) may still be busy with it
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed += 1
        return removed

    # -- reading --------------------------------------------------------------

    def open(self, sha256: str) -> VerifyingReader:
        """The blob's content as a stream; IntegrityError at EOF if it does not match."""
        sha = check_sha(sha256)
        try:
            raw = self.path_for(sha).open("rb")
        except FileNotFoundError as exc:
            raise DeployError(f"blob {sha} is not in the cache {self.root}") from exc
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_size=CHUNK, closefd=True)
        return VerifyingReader(reader, sha)

    def verify(self, sha256: str) -> bool:
        """Read the whole blob back; False (and the blob removed) when it is damaged."""
        try:
            with self.open(sha256) as fh:
                while fh.read(CHUNK):
                    pass
        except (IntegrityError, zstandard.ZstdError):
            self.remove(sha256)
            return False
        return True


class VerifyingReader(io.RawIOBase):
    """A decompressed blob that hashes what it yields and checks it at EOF."""

    def __init__(self, inner: BinaryIO, sha256: str) -> None:
        self._inner = inner
        self._sha = sha256
        self._digest = hashlib.sha256()
        self._done = False

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:  # everything left (the caller asked for it whole)
            parts = []
            while part := self.read(CHUNK):
                parts.append(part)
            return b"".join(parts)
        try:
            data = self._inner.read(size)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"blob {self._sha} is damaged in the cache: {exc}") from exc
        if data:
            self._digest.update(data)
        elif not self._done:
            self._done = True
            if self._digest.hexdigest() != self._sha:
                raise IntegrityError(f"blob {self._sha} is damaged in the cache (sha256 differs)")
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._inner.close()
        super().close()


def _drain(src: BinaryIO, size: int | None) -> int:
    count = 0
    left = size
    while left is None or left > 0:
        chunk = src.read(CHUNK if left is None else min(CHUNK, left))
        if not chunk:
            break
        count += len(chunk)
        if left is not None:
            left -= len(chunk)
    return count


class _Aborted(Exception):
    pass


class _QueueReader:
    """What one blob's writer reads: the chunks put on the queue, then b"" at the blob's end."""

    def __init__(self, q: queue.Queue[bytes | None | _Aborted]) -> None:
        self._q = q
        self._buf = b""
        self.ended = False

    def read(self, size: int = -1) -> bytes:
        while not self._buf and not self.ended:
            item = self._q.get()
            if isinstance(item, _Aborted):
                raise item
            if item is None:
                self.ended = True
            else:
                self._buf = item
        n = len(self._buf) if size is None or size < 0 else size
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


class BackgroundWriter:
    """Blobs written into the cache by a thread of their own, while the caller reads on.

    The stream's reader hands each file's chunks over (`add`), and goes on to the next
    bytes at once; compressing and writing happen here, overlapped with it. A blob still
    exists only once its sha256 matched (BlobCache.put) and its bytes are on disk: the
    verified blobs wait in a Batch (remote/overlay_durable.py), one syncfs for each 256 MiB
    and the last, then renamed into place (`done`). At most `depth` chunks wait (bounded
    memory). Failures are kept per sha256 (`failed`); `close` waits for the last blob,
    `abort` stops at once (the blob being written is dropped, the verified ones kept).
    """

    def __init__(self, cache: BlobCache, depth: int = 32, level: int | None = None) -> None:
        self.cache = cache
        self.level = level
        self._q: queue.Queue[tuple[str, int] | bytes | None | _Aborted] = queue.Queue(depth)
        self.done: list[str] = []  # stored: verified, on disk, renamed into place
        self.failed: dict[str, BaseException] = {}
        self._batch = Batch(str(cache.root / "tmp"))
        self._waiting: list[str] = []  # verified, in the batch
        self._thread = threading.Thread(target=self._run, name="cache-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._blobs()
        finally:
            self._flush()  # what is verified is kept, also when the stream is given up

    def _flush(self) -> None:
        waiting, self._waiting = self._waiting, []
        try:
            self._batch.flush()
        except OSError as exc:
            for sha in waiting:
                self.failed[sha] = DeployError(f"cannot write blob {sha} in "
                                               f"{self.cache.root}: {exc}")
            return
        self.done.extend(waiting)

    def _blobs(self) -> None:
        while True:
            item = self._q.get()
            if item is None or isinstance(item, _Aborted):
                return
            assert isinstance(item, tuple)
            sha, size = item
            reader = _QueueReader(self._q)  # type: ignore[arg-type]
            try:
                before = len(self._batch)
                self.cache.put(sha, reader, size, self.level,  # type: ignore[arg-type]
                               batch=self._batch)
                if len(self._batch) > before:
                    self._waiting.append(sha)
                else:
                    self.done.append(sha)  # it was there already
                if self._batch.full():
                    self._flush()
            except _Aborted:
                return
            except Exception as exc:  # kept for the caller, who raises it
                self.failed[sha] = exc
            try:
                while not reader.ended:  # the rest of this blob's chunks
                    reader._buf = b""
                    reader.read(CHUNK)
            except _Aborted:
                return

    def add(self, sha256: str, src: BinaryIO, size: int) -> None:
        """Hand over `size` bytes of `src` (read here, in 1 MiB chunks) as blob `sha256`."""
        self._q.put((sha256, size))
        left = size
        while left > 0:
            chunk = src.read(min(CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            self._q.put(chunk)
        self._q.put(None)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()

    def abort(self) -> None:
        with contextlib.suppress(queue.Full):
            while self._thread.is_alive():
                try:
                    self._q.put(_Aborted(), timeout=0.1)
                    break
                except queue.Full:
                    with contextlib.suppress(queue.Empty):
                        self._q.get_nowait()  # make room: what is dropped is never stored
        self._thread.join()
