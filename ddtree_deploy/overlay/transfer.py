"""Moving a lane's files: source -> workstation blob cache (fetch), streamed; what push shares.

fetch: one `python -c` of remote/overlay_source_tar.py on the source writes a tar of the
needed files (members named by sha256) to stdout; the workstation reads it member by member
(remote/overlay_tar_read.py: each byte read once) and stores each member in the BlobCache,
which verifies the sha256 before a blob exists. Only contents the cache lacks are asked for,
so a second target or a re-run fetches nothing again.

push (cache -> a target's staging, verified there) is push.py; it shares the report, the
pipe writer and the counting reader defined here.

Memory stays bounded: 1 MiB chunks and an OS pipe between the transport's thread
and the tar reader or writer; no file is ever held whole.

relay.py composes these into the pipelined transfer (the source's stream goes to
every target while it arrives); whether a stream is compressed is measured there
(wire.py). The measurements behind the transport and compression choices, old and
new, are in benchmarks/RESULTS.md ("Bulk transfer" and "Overlay on the real CUDA 13
lane").
"""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

import zstandard

from ddtree_deploy.errors import DeployError, TransportError
from ddtree_deploy.overlay.blobcache import (
    CHUNK,
    STORE_LEVEL,
    BackgroundWriter,
    BlobCache,
    IntegrityError,
)
from ddtree_deploy.overlay.model import FileEntry
from ddtree_deploy.overlay.progress import NullProgress, ProgressSink
from ddtree_deploy.remote import overlay_transfer as scripts
from ddtree_deploy.remote.overlay_tar_read import Member, TarReader
from ddtree_deploy.remote.runner import failure
from ddtree_deploy.transport.base import Result, Transport
from ddtree_deploy.transport.command import Command

# The source's stream. Tried in run H (benchmarks/RESULTS.md): -3 without --long, on the
# 16-core host, sent 825 MB for the lane where -1 --long=27 sent 800 MB, and its stream was
# no faster (the stream is link-bound there, not compressor-bound): kept -1 --long=27.
ZSTD_FLAGS = "-1 --long=27"
WINDOW_LOG = 27
CHECK_TIMEOUT = 3600.0


@dataclass
class TransferReport:
    """What one fetch or push did. `payload` counts file bytes, `wire` the bytes moved."""

    files: int = 0
    payload: int = 0
    wire: int = 0
    skipped: int = 0  # files not moved because the cache / the staging already had them
    compressed: bool = False
    seconds: float = 0.0


def unique_by_sha(files: Iterable[FileEntry]) -> list[FileEntry]:
    """One entry per content (first path wins), order kept."""
    seen: dict[str, FileEntry] = {}
    for entry in files:
        seen.setdefault(entry.sha256, entry)
    return list(seen.values())


class Forwarder(Protocol):
    """Where the source's stream also goes as it arrives (a target's receiver)."""

    def start(self, compressed: bool) -> None: ...

    def feed(self, data: bytes) -> None: ...

    def finish(self) -> None: ...


class PipeWriter:
    """The write end of an OS pipe as a file; after the reader gives up it discards.

    With forwarders, every byte after the first (the stream's kind: Z or P) also goes
    to each of them, in the order it arrived, before the local reader gets it.
    """

    def __init__(self, fd: int, forward: Sequence[Forwarder] = ()) -> None:
        self.fd = fd
        self.count = 0
        self.discard = False
        self.forward = list(forward)
        self._started = False

    def write(self, data: bytes) -> int:
        self.count += len(data)
        if self.forward and not self.discard:
            rest = data
            if not self._started and data:
                self._started = True
                for f in self.forward:
                    f.start(data[:1] == b"Z")
                rest = data[1:]
            if rest:
                for f in self.forward:
                    f.feed(rest)
        view = memoryview(data)
        while view and not self.discard:
            try:
                view = view[os.write(self.fd, view) :]
            except (BrokenPipeError, OSError):
                self.discard = True
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        for f in self.forward:
            f.finish()


class Counted:
    """A readable that reports each chunk read to a progress callback."""

    def __init__(self, inner: BinaryIO, tick: Callable[[int], None]) -> None:
        self._inner = inner
        self._tick = tick

    def read(self, size: int = -1) -> bytes:
        data = self._inner.read(size)
        if data:
            self._tick(len(data))
        return data


def str_list(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


# -- fetch ----------------------------------------------------------------------


def fetch(
    source: Transport,
    site_packages: str,
    files: Iterable[FileEntry],
    cache: BlobCache,
    progress: ProgressSink | None = None,
    *,
    python: str = "python3",
    compress: bool = True,
    sudo: bool = False,
    forward: Sequence[Forwarder] = (),
    also: Sequence[int] = (),
) -> TransferReport:
    """Bring every content of `files` the cache lacks from `source` into `cache`.

    `forward`: receivers that get the stream too, as it arrives (see relay.py); `also`:
    progress tasks advanced with the fetch's own (theirs move in step with it).
    """
    progress = progress or NullProgress()
    t0 = time.monotonic()
    entries = unique_by_sha(files)
    need = [e for e in entries if not cache.has(e.sha256)]
    report = TransferReport(skipped=len(entries) - len(need))
    if not need:
        return report
    by_sha = {e.sha256: e for e in need}
    listing = json.dumps([[e.sha256, e.path] for e in need]).encode()
    cmd = Command.shell(
        scripts.SOURCE_SHELL, python, scripts.source_tar(), site_packages,
        ZSTD_FLAGS if compress else "", stdin=listing, sudo=sudo,
    )  # fmt: skip
    rfd, wfd = os.pipe()
    writer = PipeWriter(wfd, forward)
    outcome: list[Result | BaseException] = []

    def produce() -> None:
        try:
            outcome.append(source.run_stream_out(cmd, writer))  # type: ignore[arg-type]
        except BaseException as exc:
            outcome.append(exc)
        finally:
            writer.close()

    task = progress.begin(source.host, "fetch", sum(e.size for e in need))
    thread = threading.Thread(target=produce, name=f"fetch-{source.host}", daemon=True)
    thread.start()
    reader = os.fdopen(rfd, "rb", buffering=CHUNK)
    seen: dict[str, str] = {}
    try:
        _read_source_tar(reader, by_sha, cache, report, progress, [task, *also], seen)
    except BaseException as exc:
        writer.discard = True
        reader.close()
        if seen.get("pid", "").isdecimal():
            with contextlib.suppress(DeployError):
                source.run(Command.of("kill", "-TERM", seen["pid"], sudo=sudo), timeout=15)
        thread.join(timeout=30)
        done = outcome[0] if outcome else None
        broken = isinstance(done, Result) and (not done.ok or done.stderr.strip())
        if isinstance(exc, TransportError) and isinstance(done, Result) and broken:
            raise failure(done, "reading the lane's files on the source") from exc
        if isinstance(exc, TransportError) and isinstance(done, BaseException):
            raise done from exc
        raise
    finally:
        reader.close()
        progress.end(task)
    thread.join()
    report.wire = writer.count
    result = outcome[0] if outcome else None
    if isinstance(result, BaseException):
        raise result
    if result is not None and not result.ok and report.files < len(need):
        raise failure(result, "reading the lane's files on the source")
    report.seconds = time.monotonic() - t0
    return report


def _read_source_tar(
    reader: BinaryIO,
    by_sha: dict[str, FileEntry],
    cache: BlobCache,
    report: TransferReport,
    progress: ProgressSink,
    tasks: list[int],
    seen: dict[str, str],
) -> None:
    """Store the stream's files in the cache; `seen["pid"]`: the source's process."""
    host = progress.host(tasks[0])

    def tick(n: int) -> None:
        for t in tasks:
            progress.advance(t, n)

    kind = reader.read(1)
    stream: BinaryIO = reader
    if kind == b"Z":
        report.compressed = True
        dctx = zstandard.ZstdDecompressor(max_window_size=1 << WINDOW_LOG)
        stream = dctx.stream_reader(reader, read_size=CHUNK)
    elif kind != b"P":
        raise TransportError(f"{host}: the source sent no file stream (is python there?)")
    end_box: list[dict[str, object]] = []
    # compress, write, fsync in a thread of its own: overlapped with this reading
    writer = BackgroundWriter(cache, level=STORE_LEVEL)
    by_name = {e.sha256: e for e in by_sha.values()}

    def check() -> None:
        for sha, exc in list(writer.failed.items()):
            if isinstance(exc, IntegrityError):
                raise IntegrityError(f"{host}: {by_name[sha].path} changed since the plan was "
                                     f"made ({exc}); re-run the plan") from exc
            raise exc

    try:
        _read_members(stream, by_sha, writer, report, tick, seen, host, check, end_box)
        writer.close()
        check()
    except BaseException:
        writer.abort()
        raise
    report.files = len(writer.done)
    report.payload = sum(by_name[s].size for s in writer.done)
    end = end_box[0] if end_box else None
    if end is None:
        raise TransportError(f"{host}: the file stream from the source ended early", hint=None)
    missing = end.get("missing")
    if isinstance(missing, list) and missing:
        names = ", ".join(str(m[0]) if isinstance(m, list) else str(m) for m in missing[:5])
        raise DeployError(
            f"{host}: {len(missing)} file(s) of the lane are missing on the source: {names}",
            hint="the source venv changed since the plan was made; re-run the plan",
        )


def _read_members(stream: BinaryIO, by_sha: dict[str, FileEntry], writer: BackgroundWriter,
                  report: TransferReport, tick: Callable[[int], None], seen: dict[str, str],
                  host: str, check: Callable[[], None], end_box: list[dict[str, object]]
                  ) -> None:
    try:
        tar = TarReader(stream)  # each byte read once into one buffer (remote/overlay_tar_read)
        for member in tar:
            if not member.isfile():
                raise TransportError(f"{host}: unexpected entry {member.name!r} in the stream")
            if member.name == "pid":
                seen["pid"] = _whole(tar, member)[:32].decode("ascii", "replace").strip()
                continue
            if member.name == "end":
                end_box.append(json.loads(_whole(tar, member)))
                break
            entry = by_sha.get(member.name)
            if entry is None:
                raise TransportError(f"{host}: the source sent a file not asked for")
            if member.size != entry.size:
                raise IntegrityError(
                    f"{host}: {entry.path} has {member.size} bytes on the source, "
                    f"the manifest says {entry.size}; re-run the plan"
                )
            counted = Counted(_MemberChunks(tar, member), tick)  # type: ignore[arg-type]
            writer.add(entry.sha256, counted, entry.size)  # type: ignore[arg-type]
            check()
    except (tarfile.TarError, EOFError, ValueError, zstandard.ZstdError) as exc:
        raise TransportError(f"{host}: the file stream broke off: {exc}") from exc


def _whole(tar: TarReader, member: Member) -> bytes:
    return b"".join(bytes(v) for v in tar.content(member))


class _MemberChunks:
    """A member's content as a readable: each read returns at most `size` bytes, a copy
    (the reader's buffer is reused; the cache's writer thread keeps the chunk)."""

    def __init__(self, tar: TarReader, member: Member) -> None:
        self._chunks = tar.content(member)
        self._rest = b""

    def read(self, size: int = -1) -> bytes:
        if not self._rest:
            self._rest = bytes(next(self._chunks, b""))
        n = len(self._rest) if size is None or size < 0 else size
        out, self._rest = self._rest[:n], self._rest[n:]
        return out


# -- push -----------------------------------------------------------------------
