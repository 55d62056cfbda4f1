"""Durable in batches (remote/overlay_durable.py): no name is given before the sync.

The staging receiver and the blob cache write blobs with no fsync each; one syncfs per batch
comes before any of the batch's renames (and the receiver's records). These tests watch the
order from inside: at every sync, none of the batch's blobs has its name yet.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import sys
import tarfile
from pathlib import Path

import pytest

from ddtree_deploy.overlay import blobcache
from ddtree_deploy.overlay.blobcache import BackgroundWriter, BlobCache
from ddtree_deploy.remote import overlay_durable, overlay_staging_receive
from ddtree_deploy.remote.overlay_durable import Batch

STAGE = "v/.ddtree-deploy/overlay/staging/p1"


def _files(tmp_path: Path, n: int, size: int) -> list[str]:
    out = []
    for i in range(n):
        path = tmp_path / f"f{i}"
        path.write_bytes(bytes([i]) * size)
        out.append(str(path))
    return out


def test_a_batch_syncs_once_then_publishes_in_order(tmp_path: Path, monkeypatch) -> None:
    events: list[object] = []
    monkeypatch.setattr(Batch, "sync", lambda self, paths: events.append(("sync", paths)))
    batch = Batch(str(tmp_path), limit=300)
    paths = _files(tmp_path, 3, 100)
    for p in paths[:2]:
        batch.add(p, 100, lambda p=p: events.append(p))
        assert not batch.full()
    batch.add(paths[2], 100, lambda: events.append(paths[2]))
    assert batch.full() and len(batch) == 3 and events == []  # nothing published yet
    batch.flush()
    assert events == [("sync", paths), *paths]
    assert len(batch) == 0 and not batch.full()
    batch.flush()  # an empty batch: no sync at all
    assert len(events) == 4


def test_a_failed_sync_publishes_nothing_and_deletes_the_batch(tmp_path: Path,
                                                             monkeypatch) -> None:
    def broken(self: Batch, paths: list[str]) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(Batch, "sync", broken)
    batch = Batch(str(tmp_path))
    paths = _files(tmp_path, 2, 10)
    published: list[str] = []
    for p in paths:
        batch.add(p, 10, lambda p=p: published.append(p))
    with pytest.raises(OSError, match="Input/output"):
        batch.flush()
    assert published == [] and not any(os.path.exists(p) for p in paths)


def test_the_sync_is_syncfs_or_os_sync_or_an_fsync_each(tmp_path: Path, monkeypatch) -> None:
    paths = _files(tmp_path, 2, 10)
    batch = Batch(str(tmp_path))
    if sys.platform.startswith("linux"):
        assert batch._libc is not None  # the real syncfs, through ctypes
    batch.sync(paths)
    calls: list[str] = []
    monkeypatch.setattr(overlay_durable, "_libc", lambda: None)
    monkeypatch.setattr(os, "sync", lambda: calls.append("sync"))
    Batch(str(tmp_path)).sync(paths)
    assert calls == ["sync"]
    monkeypatch.delattr(os, "sync")
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    Batch(str(tmp_path)).sync(paths)
    assert calls == ["sync", "fsync", "fsync"]


def _tar(blobs: list[bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|") as tar:
        for data in blobs:
            info = tarfile.TarInfo(hashlib.sha256(data).hexdigest())
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        end = tarfile.TarInfo("end")
        tar.addfile(end, io.BytesIO(b""))
    return buf.getvalue()


class _Stdin:
    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)


def test_the_receiver_names_and_records_a_blob_only_after_its_sync(
        tmp_path: Path, monkeypatch, capsys) -> None:
    staging = tmp_path / STAGE
    rng = random.Random(3)
    blobs = [rng.randbytes(n) for n in (3000, 5000, 7000)]
    seen: list[tuple[int, int]] = []  # at each sync: blobs named, lines recorded
    real = Batch.sync

    def watched(self: Batch, paths: list[str]) -> None:
        named = len(os.listdir(staging / "blobs"))
        rec = staging / "verified.jsonl"
        seen.append((named, len(rec.read_text().splitlines()) if rec.exists() else 0))
        assert all(os.path.exists(p) and p.endswith(".part") for p in paths)
        real(self, paths)

    monkeypatch.setattr(Batch, "sync", watched)
    monkeypatch.setattr(overlay_durable, "BATCH_BYTES", 6000)  # batches: [3000, 5000], [7000]
    monkeypatch.setattr(sys, "stdin", _Stdin(_tar(blobs)))
    assert overlay_staging_receive.main([str(staging)]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answer["complete"] and answer["error"] is None and answer["bad"] == []
    assert seen == [(0, 0), (2, 2)]
    shas = [hashlib.sha256(b).hexdigest() for b in blobs]
    assert answer["ok"] == shas
    assert sorted(os.listdir(staging / "blobs")) == sorted(shas)
    assert not os.listdir(staging / "incoming")
    lines = (staging / "verified.jsonl").read_text().splitlines()
    records = [json.loads(line)[0] for line in lines]
    assert records == shas


def test_the_receiver_keeps_what_it_verified_when_the_stream_breaks(
        tmp_path: Path, monkeypatch, capsys) -> None:
    staging = tmp_path / STAGE
    blobs = [b"a" * 4000, b"b" * 4000]
    data = _tar(blobs)
    cut = data[:512 + 4096 + 512 + 1000]  # the first blob whole, the second cut short
    monkeypatch.setattr(sys, "stdin", _Stdin(cut))
    assert overlay_staging_receive.main([str(staging)]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not answer["complete"] and answer["error"]
    assert answer["ok"] == [hashlib.sha256(blobs[0]).hexdigest()]
    assert os.listdir(staging / "blobs") == answer["ok"]


def test_the_cache_names_a_streamed_blob_only_after_its_sync(tmp_path: Path,
                                                           monkeypatch) -> None:
    cache = BlobCache(tmp_path / "c")
    rng = random.Random(5)
    contents = [rng.randbytes(n) for n in (200_000, 300_000, 100_000)]
    shas = [hashlib.sha256(c).hexdigest() for c in contents]
    at_sync: list[list[bool]] = []
    real = Batch.sync

    def watched(self: Batch, paths: list[str]) -> None:
        at_sync.append([cache.has(s) for s in shas])
        assert all(Path(p).parent == cache.root / "tmp" for p in paths)
        real(self, paths)

    monkeypatch.setattr(Batch, "sync", watched)
    monkeypatch.setattr(overlay_durable, "BATCH_BYTES", 1)  # each blob a batch of its own
    writer = BackgroundWriter(cache, level=blobcache.STORE_LEVEL)
    for sha, data in zip(shas, contents, strict=True):
        writer.add(sha, io.BytesIO(data), len(data))
    writer.close()
    assert writer.done == shas and not writer.failed
    assert at_sync == [[False, False, False], [True, False, False], [True, True, False]]
    assert all(cache.verify(s) for s in shas) and not any((cache.root / "tmp").iterdir())


def test_the_cache_keeps_verified_blobs_when_the_stream_is_given_up(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "c")
    data = b"kernel" * 50_000
    sha = hashlib.sha256(data).hexdigest()
    writer = BackgroundWriter(cache)
    writer.add(sha, io.BytesIO(data), len(data))
    writer.add("0" * 64, io.BytesIO(b"x" * 10), 20)  # cut short: never stored
    writer.abort()
    assert cache.has(sha) and cache.verify(sha) and not cache.has("0" * 64)
    assert not any((cache.root / "tmp").iterdir())
