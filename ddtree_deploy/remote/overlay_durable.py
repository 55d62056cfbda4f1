"""Durable in batches: files written with no fsync each, then one sync before they are published.

Used by the target's staging receiver (bundled with it) and by the workstation's blob cache.
A file is written to a temporary name and checked (its sha256) with no fsync of its own; the
kernel is asked to start writing it out at once (sync_file_range, SYNC_FILE_RANGE_WRITE: no
wait, no journal commit), so the disk works while the stream goes on. Every so many bytes, and
at the end, one syncfs(2) of the file system waits until all of it is on disk, and only then
are the batch's files renamed to the names that publish them (the cache's blob, the staging's
blob and its line in verified.jsonl). A per-file fsync cost one journal commit and one flush
of the disk's cache for every file, on the stream's own path; here a batch costs one.

Why the order keeps power-loss safety: a name is only ever given to a file whose bytes the
sync has already put on disk. A power loss before the sync leaves temporaries (removed by
the next run, their contents sent again); after the sync and before or during the renames,
each name either is missing (a blob missing: sent again) or names bytes already durable. So
what a name says is verified stays true across a crash, as with an fsync per file: the
receiver's record (size, inode, mtime, ctime), which the apply trusts instead of hashing
again, is written after the rename, so it never names bytes that were not on disk. The rename
itself may be lost by a power loss (as before): then the blob is absent, never wrong.

syncfs is called through ctypes; where that is not possible, os.sync() (every file system);
where neither is, an fsync of each file of the batch (the old way). Python >= 3.8, stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from typing import Any

SYNC_FILE_RANGE_WRITE = 2
BATCH_BYTES = 256 << 20  # published at least this often: what a kill can cost to resend


def _libc() -> Any:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syncfs.argtypes = [ctypes.c_int]
        libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_uint]
        return libc
    except (ImportError, OSError, AttributeError):
        return None


class Batch:
    """Files written and checked, waiting for one sync of their file system before they are
    published (`publish(path)` each: the rename and whatever records it)."""

    def __init__(self, folder: str, limit: int | None = None) -> None:
        self.folder = folder  # any folder on the file system the files are written to
        self.limit = BATCH_BYTES if limit is None else limit
        self._libc = _libc()
        self._pending: list[tuple[str, int, Callable[[], None]]] = []
        self._bytes = 0

    def written(self, fd: int) -> None:
        """The file on `fd` is written (flushed): start its writing to disk, without waiting."""
        if self._libc is not None:
            self._libc.sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)  # a hint: errors ignored

    def add(self, path: str, size: int, publish: Callable[[], None]) -> None:
        """`path` (closed, checked) is published by `publish` after the next sync."""
        self._pending.append((path, size, publish))
        self._bytes += size

    def full(self) -> bool:
        """Whether the batch holds `limit` bytes: time to flush."""
        return self._bytes >= self.limit

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Sync, then publish every pending file, in the order added. On an error, the files
        not published are deleted (never named, so sent again) and the error raised."""
        pending, self._pending, self._bytes = self._pending, [], 0
        if not pending:
            return
        done = 0
        try:
            self.sync([p for p, _, _ in pending])
            for _, _, publish in pending:
                publish()
                done += 1
        finally:
            for path, _, _ in pending[done:]:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def sync(self, paths: list[str]) -> None:
        """Everything written to the file system of `folder` is on disk when this returns."""
        err = self._syncfs()
        if err is None:
            return
        if err != 0:
            raise OSError(err, f"syncfs of {self.folder}: {os.strerror(err)}")
        for path in paths:  # no syncfs here and no os.sync: an fsync each
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _syncfs(self) -> int | None:
        """None: synced; 0: no way to sync the file system here; else an errno."""
        if self._libc is not None:
            import ctypes

            fd = os.open(self.folder, os.O_RDONLY)
            try:
                if self._libc.syncfs(fd) == 0:
                    return None
                err = ctypes.get_errno()
            finally:
                os.close(fd)
            if err not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter; another way
                return err
        if hasattr(os, "sync"):
            os.sync()  # Linux waits for it (since 1.3.20)
            return None
        return 0
