"""Pushing a lane's files: workstation blob cache -> a target's staging, streamed.

One round trip hashes what the target's staging already holds (right hash: skipped,
damaged: deleted); a second streams a tar of the missing blobs into a receiver on the
target that hashes each file while writing it and renames it into
``staging/blobs/<sha256>`` only when it matches. Its JSON answer lists every file verified;
anything missing or damaged raises IntegrityError. A cache blob already stored as a zstd
frame goes to a target with zstd as it is (no recompression on the way). The fetch side and
what both share are in transfer.py.
"""

from __future__ import annotations

import json
import os
import tarfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

from ddtree_deploy.errors import DeployError
from ddtree_deploy.overlay.blobcache import (
    CHUNK,
    BlobCache,
    IntegrityError,
)
from ddtree_deploy.overlay.model import FileEntry
from ddtree_deploy.overlay.progress import NullProgress, ProgressSink
from ddtree_deploy.overlay.transfer import (
    CHECK_TIMEOUT,
    Counted,
    PipeWriter,
    TransferReport,
    str_list,
    unique_by_sha,
)
from ddtree_deploy.remote import overlay_transfer as scripts
from ddtree_deploy.remote.runner import read_json, run_json
from ddtree_deploy.transport.base import Transport
from ddtree_deploy.transport.command import Command


def push(
    target: Transport,
    staging_dir: str,
    files: Iterable[FileEntry],
    cache: BlobCache,
    progress: ProgressSink | None = None,
    *,
    python: str = "python3",
    compress: bool = True,
    sudo: bool = False,
) -> TransferReport:
    """Make `staging_dir/blobs/<sha256>` hold every content of `files`, verified there."""
    entries = unique_by_sha(files)
    absent = [e.sha256 for e in entries if not cache.has(e.sha256)]
    if absent:
        raise DeployError(f"{len(absent)} blob(s) to push are not in the cache (fetch first)")
    state = staging_check(target, staging_dir, entries, python=python, sudo=sudo)
    need = [e for e in entries if e.sha256 not in state.present]
    report = send_from_cache(target, staging_dir, need, cache, progress, python=python,
                             compress=compress and state.zstd, sudo=sudo, free=state.free)
    report.skipped = len(entries) - len(need)
    return report


@dataclass
class StagingState:
    present: set[str]
    zstd: bool
    free: int | None


def staging_check(target: Transport, staging_dir: str, entries: list[FileEntry], *,
                  python: str = "python3", sudo: bool = False) -> StagingState:
    """Which contents the target's staging already holds, verified (damaged ones deleted)."""
    listing = json.dumps([[e.sha256, e.size] for e in entries]).encode()
    check = Command.of(python, "-c", scripts.staging_check(), staging_dir, stdin=listing,
                       sudo=sudo)
    state = run_json(target, check, timeout=CHECK_TIMEOUT, what="the staging check",
                     answers=None)  # its JSON says how it went
    free = state.get("free")
    return StagingState(set(str_list(state.get("present"))), bool(state.get("zstd")),
                        free if isinstance(free, int) else None)


def send_from_cache(
    target: Transport,
    staging_dir: str,
    need: list[FileEntry],
    cache: BlobCache,
    progress: ProgressSink | None = None,
    *,
    python: str = "python3",
    compress: bool = True,
    sudo: bool = False,
    free: int | None = None,
) -> TransferReport:
    """Stream `need` (unique contents, all cached) into the target's staging, verified there."""
    progress = progress or NullProgress()
    report = TransferReport()
    if not need:
        return report
    use_zstd = compress
    report.compressed = use_zstd
    total = sum(e.size for e in need)
    if free is not None and free < total:
        raise DeployError(
            f"{target.host}: {staging_dir} has {free} bytes free, the staging needs {total}"
        )
    t0 = time.monotonic()
    task = progress.begin(target.host, "push", total)
    rfd, wfd = os.pipe()
    writer = PipeWriter(wfd)
    errors: list[BaseException] = []
    thread = threading.Thread(
        target=_write_tar, args=(writer, need, cache, use_zstd, progress, task, errors),
        name=f"push-{target.host}", daemon=True,
    )  # fmt: skip
    cmd = Command.shell(
        scripts.RECEIVE_SHELL, python, scripts.staging_receive(), staging_dir,
        "z" if use_zstd else "", sudo=sudo,
    )
    thread.start()
    try:
        with os.fdopen(rfd, "rb", buffering=0) as pipe_in:
            result = target.run_stream_in(cmd, pipe_in)
            writer.discard = True  # the far side stopped reading: let the writer finish
    finally:
        thread.join()
        progress.end(task)
    report.wire = writer.count
    if errors:
        raise errors[0]
    answer = read_json(result, "the staging receiver", answers=None)  # the JSON says what came
    try:
        check_received(target.host, staging_dir, need, answer)
    except IntegrityError:
        if use_zstd:  # the cache's frames went unread here: a damaged one is removed now
            ok = set(str_list(answer.get("ok")))
            for e in need:
                if e.sha256 not in ok:
                    cache.verify(e.sha256)
        raise
    report.files = len(need)
    report.payload = total
    report.seconds = time.monotonic() - t0
    return report


def check_received(host: str, staging_dir: str, need: list[FileEntry],
                   answer: dict[str, object]) -> None:
    """IntegrityError unless the receiver's answer lists every content of `need` as ok."""
    ok = set(str_list(answer.get("ok")))
    bad = [e for e in need if e.sha256 not in ok]
    if bad:
        detail = answer.get("error") or "content differs from its sha256"
        raise IntegrityError(
            f"{host}: {len(bad)} file(s) did not arrive intact in {staging_dir} "
            f"(e.g. {bad[0].path}): {detail}",
            hint="re-run: verified files are kept, only the rest is sent again",
        )


def _write_tar(
    writer: PipeWriter,
    need: list[FileEntry],
    cache: BlobCache,
    use_zstd: bool,
    progress: ProgressSink,
    task: int,
    errors: list[BaseException],
) -> None:
    try:
        if use_zstd:
            _write_frames(writer, need, cache, progress, task)
            return
        sink: BinaryIO = writer  # type: ignore[assignment]
        tar = tarfile.open(  # noqa: SIM115 - closed below, after the end marker
            fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK
        )
        tar.copybufsize = CHUNK  # type: ignore[attr-defined]
        for entry in need:
            if writer.discard:
                break
            info = tarfile.TarInfo(entry.sha256)
            info.size = entry.size
            info.mode = 0o644
            with cache.open(entry.sha256) as blob:
                tar.addfile(info, Counted(blob, lambda n: progress.advance(task, n)))  # type: ignore[arg-type]
        end = tarfile.TarInfo("end")
        tar.addfile(end)
        tar.close()
    except BaseException as exc:
        errors.append(exc)
    finally:
        writer.close()


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _write_frames(writer: PipeWriter, need: list[FileEntry], cache: BlobCache,
                  progress: ProgressSink, task: int) -> None:
    """The same tar as a run of zstd frames: each file's content is its cached frame as stored.

    `zstd -d` on the target turns concatenated frames into the concatenation of their
    contents, so the receiver reads an ordinary tar. Tar headers and padding go in small
    frames of their own. Nothing is decompressed or compressed here: the bytes on the wire
    are the cache's (densify.py makes them denser); the receiver hashes every file as before.
    """
    small = zstandard.ZstdCompressor(level=1)
    pending = b""  # the previous file's padding and the next header, sent as one frame
    for entry in need:
        if writer.discard:
            return
        stored = cache.size(entry.sha256)
        if stored != entry.size:
            raise IntegrityError(f"blob {entry.sha256} in the cache holds {stored} bytes, "
                                 f"the plan says {entry.size}")
        writer.write(small.compress(pending + _header(entry.sha256, entry.size)))
        with cache.path_for(entry.sha256).open("rb") as raw:
            on_disk = os.fstat(raw.fileno()).st_size
            sent = done = 0
            while chunk := raw.read(CHUNK):
                writer.write(chunk)
                sent += len(chunk)
                step = entry.size * sent // max(on_disk, 1) - done  # progress in file bytes
                progress.advance(task, step)
                done += step
            progress.advance(task, entry.size - done)
        pending = b"\0" * (-entry.size % tarfile.BLOCKSIZE)
    end = pending + _header("end", 0) + b"\0" * (2 * tarfile.BLOCKSIZE)
    writer.write(small.compress(end))
