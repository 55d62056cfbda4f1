"""The overlay transfer: source site-packages -> blob cache -> target staging.

Runs over LocalTransport and over SshTransport to a real loopback sshd
(tests/sshd_fixture.py). The scratch "venv" holds multi-MB files (random, so
incompressible, and repetitive ones) plus a bin/ script reached via ../../../bin.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
from sshd_fixture import Sshd

from ddtree_deploy.errors import DeployError
from ddtree_deploy.overlay import transfer
from ddtree_deploy.overlay.blobcache import BlobCache, IntegrityError
from ddtree_deploy.overlay.model import FileEntry
from ddtree_deploy.overlay.progress import CountingProgress
from ddtree_deploy.overlay.push import push
from ddtree_deploy.overlay.transfer import fetch
from ddtree_deploy.transport import LocalTransport, SshTransport, Transport

PY = sys.executable
MiB = 1024 * 1024
STAGE = "v/.ddtree-deploy/overlay/staging/p1"  # the layout the staging scripts insist on


def _entry(sp: Path, rel: str) -> FileEntry:
    data = (sp / rel).read_bytes()
    return FileEntry(path=rel, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


@pytest.fixture
def venv(tmp_path: Path) -> tuple[Path, list[FileEntry]]:
    """A scratch venv: returns its site-packages and the RECORD-style entries."""
    sp = tmp_path / "src" / "lib" / "python3.11" / "site-packages"
    (sp / "torch" / "lib").mkdir(parents=True)
    (sp / "torch-2.11.0.dist-info").mkdir()
    (tmp_path / "src" / "bin").mkdir()
    rng = random.Random(1234)
    (sp / "torch" / "lib" / "libbig.so").write_bytes(rng.randbytes(6 * MiB + 123))
    (sp / "torch" / "lib" / "librep.so").write_bytes(b"\x7fELF" + b"cuda-kernel" * 700_000)
    (sp / "torch" / "__init__.py").write_text("x = 1\n")
    (sp / "torch" / "dup.py").write_text("x = 1\n")  # same content as __init__.py
    (sp / "torch" / "empty.py").write_bytes(b"")
    (sp / "torch-2.11.0.dist-info" / "RECORD").write_text("torch/__init__.py,,\n")
    (tmp_path / "src" / "bin" / "torchrun").write_text("#!/bin/sh\necho run\n")
    rels = [
        "torch/lib/libbig.so",
        "torch/lib/librep.so",
        "torch/__init__.py",
        "torch/dup.py",
        "torch/empty.py",
        "torch-2.11.0.dist-info/RECORD",
        "../../../bin/torchrun",
    ]
    return sp, [_entry(sp, r) for r in rels]


@pytest.fixture
def cache(tmp_path: Path) -> BlobCache:
    return BlobCache(tmp_path / "cache")


def _blob_count(cache: BlobCache) -> int:
    return len(list((cache.root / "sha256").glob("*/*.zst")))


def _staged(staging: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (staging / "blobs").iterdir()}


def _roundtrip(host: Transport, venv: tuple[Path, list[FileEntry]], cache: BlobCache, tmp: Path):
    sp, files = venv
    unique = {f.sha256: f for f in files}
    total = sum(f.size for f in unique.values())
    progress = CountingProgress()
    got = fetch(host, str(sp), files, cache, progress, python=PY)
    assert got.files == len(unique) == _blob_count(cache) and got.payload == total
    assert got.compressed  # the machine has zstd; the repetitive file makes it pay
    assert 0 < got.wire < total  # compressed on the wire
    for entry in files:
        with cache.open(entry.sha256) as fh:
            assert fh.read() == (sp / entry.path).read_bytes()
    (task,) = progress.tasks.values()
    assert task["total"] == total and task["done"] == total and task["ended"]

    again = fetch(host, str(sp), files, cache, python=PY)
    assert (again.files, again.wire, again.skipped) == (0, 0, len(unique))

    staging = tmp / "target" / ".ddtree-deploy" / "overlay" / "staging" / "plan1"
    sent = push(host, str(staging), files, cache, python=PY)
    assert sent.files == len(unique) and sent.payload == total and 0 < sent.wire < total
    staged = _staged(staging)
    assert set(staged) == set(unique)
    for sha, data in staged.items():
        assert hashlib.sha256(data).hexdigest() == sha
    assert not any((staging / "incoming").iterdir())

    resent = push(host, str(staging), files, cache, python=PY)
    assert (resent.files, resent.wire, resent.skipped) == (0, 0, len(unique))
    return staging


# -- local ------------------------------------------------------------------------


def test_fetch_push_rerun_sends_nothing_local(venv, cache: BlobCache, tmp_path: Path) -> None:
    _roundtrip(LocalTransport(), venv, cache, tmp_path)


def test_plain_stream_without_zstd(venv, cache: BlobCache, tmp_path: Path) -> None:
    sp, files = venv
    got = fetch(LocalTransport(), str(sp), files, cache, python=PY, compress=False)
    assert not got.compressed and got.wire > got.payload  # tar headers, no compression
    staging = tmp_path / STAGE
    sent = push(LocalTransport(), str(staging), files, cache, python=PY, compress=False)
    assert not sent.compressed and sent.files == len({f.sha256 for f in files})


def test_damaged_staged_file_is_the_only_one_sent_again(venv, cache, tmp_path: Path) -> None:
    sp, files = venv
    host = LocalTransport()
    fetch(host, str(sp), files, cache, python=PY)
    staging = tmp_path / STAGE
    push(host, str(staging), files, cache, python=PY)
    big = files[0]
    blob = staging / "blobs" / big.sha256
    data = bytearray(blob.read_bytes())
    data[4 * MiB] ^= 0x01
    blob.write_bytes(bytes(data))
    again = push(host, str(staging), files, cache, python=PY)
    assert again.files == 1 and again.payload == big.size
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == big.sha256


def test_source_changed_since_plan_is_caught(venv, cache: BlobCache) -> None:
    sp, files = venv
    big = files[0]
    path = sp / big.path
    data = bytearray(path.read_bytes())
    data[3 * MiB + 7] ^= 0xFF  # one corrupted byte, same size
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="changed since the plan"):
        fetch(LocalTransport(), str(sp), files, cache, python=PY)
    assert not cache.has(big.sha256)
    assert not any((cache.root / "tmp").iterdir())
    assert all(cache.verify(f.sha256) for f in files if cache.has(f.sha256))


def test_size_and_missing_file_on_source(venv, cache: BlobCache) -> None:
    sp, files = venv
    (sp / "torch" / "__init__.py").write_text("x = 22\n")
    with pytest.raises(IntegrityError, match="the manifest says"):
        fetch(LocalTransport(), str(sp), files[2:3], cache, python=PY)
    (sp / "torch" / "__init__.py").unlink()
    with pytest.raises(DeployError, match=r"missing on the source: torch/__init__.py") as info:
        fetch(LocalTransport(), str(sp), files[2:3], cache, python=PY)
    assert "Traceback" not in str(info.value)


def test_corrupted_byte_in_transit_to_target_is_caught(
    venv, cache: BlobCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sp, files = venv
    host = LocalTransport()
    fetch(host, str(sp), files, cache, python=PY)
    big = files[0]
    real_open = BlobCache.open

    def flipping(self: BlobCache, sha: str) -> BinaryIO:
        data = bytearray(real_open(self, sha).read())
        if sha == big.sha256:
            data[5 * MiB] ^= 0x10
        return io.BytesIO(bytes(data))

    monkeypatch.setattr(BlobCache, "open", flipping)
    staging = tmp_path / STAGE
    with pytest.raises(IntegrityError, match=r"1 file\(s\) did not arrive intact"):
        push(host, str(staging), files, cache, python=PY, compress=False)
    assert big.sha256 not in _staged(staging)
    assert len(_staged(staging)) == len({f.sha256 for f in files}) - 1
    monkeypatch.setattr(BlobCache, "open", real_open)
    fixed = push(host, str(staging), files, cache, python=PY, compress=False)
    assert fixed.files == 1 and fixed.payload == big.size


def test_damaged_cached_frame_sent_as_stored_is_caught_and_dropped(
    venv, cache: BlobCache, tmp_path: Path
) -> None:
    """A compressed push sends the cache's frames unread: the target's hash catches a damaged
    one, and the workstation then drops it from its cache, so a re-run fetches it afresh."""
    sp, files = venv
    host = LocalTransport()
    fetch(host, str(sp), files, cache, python=PY)
    big = files[0]  # random bytes: stored nearly as a copy, so a flipped byte decodes wrongly
    blob = cache.path_for(big.sha256)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x10
    blob.write_bytes(bytes(data))
    staging = tmp_path / STAGE
    with pytest.raises(IntegrityError, match=r"1 file\(s\) did not arrive intact"):
        push(host, str(staging), files, cache, python=PY)
    assert big.sha256 not in _staged(staging)
    assert not cache.has(big.sha256)  # verified after the target refused it: removed
    fetch(host, str(sp), files, cache, python=PY)
    fixed = push(host, str(staging), files, cache, python=PY)
    assert fixed.files == 1 and fixed.payload == big.size and fixed.compressed
    assert hashlib.sha256(_staged(staging)[big.sha256]).hexdigest() == big.sha256


class _Interrupt(Exception):
    pass


class _StopAfter(CountingProgress):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def advance(self, task: int, nbytes: int) -> None:
        super().advance(task, nbytes)
        if int(self.tasks[task]["done"]) >= self.limit:  # type: ignore[call-overload]
            raise _Interrupt()


def _procs_with(token: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if token in line and "ps -eo" not in line]


@pytest.mark.parametrize("cut", [1, 3 * MiB, 7 * MiB])
def test_interrupted_fetch_leaves_only_verified_blobs(venv, cache, cut: int) -> None:
    sp, files = venv
    with pytest.raises(_Interrupt):
        fetch(LocalTransport(), str(sp), files, cache, _StopAfter(cut), python=PY)
    assert not any((cache.root / "tmp").iterdir())
    kept = [f for f in {f.sha256: f for f in files}.values() if cache.has(f.sha256)]
    assert all(cache.verify(f.sha256) for f in kept)
    assert not _procs_with(str(sp))  # the source's tar writer was stopped
    rest = fetch(LocalTransport(), str(sp), files, cache, python=PY)
    assert rest.skipped == len(kept)
    assert rest.files == len({f.sha256 for f in files}) - len(kept)


def test_interrupted_push_keeps_verified_blobs_only(venv, cache, tmp_path: Path) -> None:
    sp, files = venv
    host = LocalTransport()
    fetch(host, str(sp), files, cache, python=PY)
    staging = tmp_path / STAGE
    with pytest.raises(_Interrupt):
        push(host, str(staging), files, cache, _StopAfter(7 * MiB), python=PY)
    for sha, data in _staged(staging).items():
        assert hashlib.sha256(data).hexdigest() == sha
    again = push(host, str(staging), files, cache, python=PY)
    assert again.skipped == len(_staged(staging)) - again.files
    assert set(_staged(staging)) == {f.sha256 for f in files}


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "c"
    BlobCache(root)
    proc = subprocess.Popen(["true"])  # a finished process: its PID is gone
    proc.wait()
    (root / "tmp" / f"{proc.pid}-abc").write_bytes(b"partial")
    (root / "tmp" / f"{os.getpid()}-abc").write_bytes(b"busy")
    BlobCache(root)
    assert [p.name for p in (root / "tmp").iterdir()] == [f"{os.getpid()}-abc"]


def test_push_refuses_what_is_not_cached(venv, cache, tmp_path: Path) -> None:
    _, files = venv
    with pytest.raises(DeployError, match="not in the cache"):
        push(LocalTransport(), str(tmp_path / STAGE), files, cache, python=PY)


def test_memory_stays_bounded(venv, cache, tmp_path: Path, monkeypatch) -> None:
    """No read asks for a whole file: every read of the transfer is at most 1 MiB."""
    sp, files = venv
    sizes: list[int] = []
    real = transfer.Counted.read

    def spy(self: transfer.Counted, size: int = -1) -> bytes:
        sizes.append(size)
        return real(self, size)

    monkeypatch.setattr(transfer.Counted, "read", spy)
    fetch(LocalTransport(), str(sp), files, cache, python=PY)
    push(LocalTransport(), str(tmp_path / STAGE), files, cache, python=PY)
    assert sizes and all(0 < s <= MiB for s in sizes)


# -- over a real sshd ---------------------------------------------------------------


@pytest.fixture
def ssh(sshd: Sshd, tmp_path: Path) -> Iterator[SshTransport]:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n")
    t = SshTransport(
        "127.0.0.1",
        known_hosts=known,
        port=sshd.port,
        user="root",
        identity_file=sshd.client_key,
        load_ssh_config=False,
        name="ct129",
    )
    yield t
    t.close()


@pytest.mark.sshd
def test_fetch_push_rerun_sends_nothing_ssh(venv, cache, tmp_path: Path, ssh) -> None:
    _roundtrip(ssh, venv, cache, tmp_path)


@pytest.mark.sshd
def test_interrupted_fetch_over_ssh(venv, cache, ssh: SshTransport) -> None:
    sp, files = venv
    with pytest.raises(_Interrupt):
        fetch(ssh, str(sp), files, cache, _StopAfter(2 * MiB), python=PY)
    assert not any((cache.root / "tmp").iterdir())
    assert not _procs_with(str(sp))
    assert ssh.run("echo ok").stdout == "ok\n"  # the connection is still usable
    rest = fetch(ssh, str(sp), files, cache, python=PY)
    assert rest.files + rest.skipped == len({f.sha256 for f in files})
    assert all(cache.verify(f.sha256) for f in files)


def test_missing_python_on_the_far_side_is_a_clear_error(venv, cache, tmp_path: Path) -> None:
    sp, files = venv
    for compress in (True, False):
        with pytest.raises(DeployError, match=r"on the source failed.*not found") as info:
            fetch(LocalTransport(), str(sp), files, cache, python="/no/python", compress=compress)
        assert "import " not in str(info.value)  # the script itself is not dumped
    sha = cache.put_bytes(b"abc")
    entry = FileEntry(path="x", sha256=sha, size=3)
    with pytest.raises(DeployError, match=r"staging check failed \(exit 127\)"):
        push(LocalTransport(), str(tmp_path / STAGE), [entry], cache, python="/no/python")


@pytest.mark.parametrize("layout", ["not-a-staging-folder", "v/.ddtree-deploy/overlay/x/p1",
                                    "v2/.ddtree-deploy/overlay/staging/p1"])
def test_staging_outside_its_venv_is_refused(venv, cache, tmp_path: Path, layout: str) -> None:
    _, files = venv
    fetch(LocalTransport(), str(venv[0]), files, cache, python=PY)
    outside = tmp_path / "outside"
    (outside / ".ddtree-deploy" / "overlay" / "staging").mkdir(parents=True)
    (tmp_path / "v2").mkdir()
    os.symlink(outside / ".ddtree-deploy", tmp_path / "v2" / ".ddtree-deploy")  # leads out
    with pytest.raises(DeployError, match="not a staging folder inside its venv"):
        push(LocalTransport(), str(tmp_path / layout), files, cache, python=PY)
    assert not any((outside / ".ddtree-deploy" / "overlay" / "staging").iterdir())


def test_blobs_verified_on_arrival_are_not_hashed_again(venv, cache, tmp_path: Path) -> None:
    import json

    from ddtree_deploy.overlay.push import staging_check

    sp, files = venv
    host = LocalTransport()
    fetch(host, str(sp), files, cache, python=PY)
    staging = tmp_path / STAGE
    push(host, str(staging), files, cache, python=PY)
    records = [json.loads(line) for line in (staging / "verified.jsonl").read_text().splitlines()]
    assert {r[0] for r in records} == {f.sha256 for f in files}  # the receiver hashed each
    big = files[0]
    blob = staging / "blobs" / big.sha256
    # The record, not the bytes, is what the check reads: a blob swapped behind a record
    # that still matches its stat (here forged, which takes writing the record) is trusted...
    blob.write_bytes(b"Z" * big.size)
    st = blob.stat()
    with (staging / "verified.jsonl").open("a") as fh:
        fh.write(json.dumps([big.sha256, st.st_size, st.st_ino, st.st_mtime_ns,
                             st.st_ctime_ns]) + "\n")
    uniq = list({f.sha256: f for f in files}.values())
    assert big.sha256 in staging_check(host, str(staging), uniq, python=PY).present
    # ...and any later change of the blob (its ctime moves) makes it hashed, found, resent.
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: ctime still moves
    while blob.stat().st_ctime_ns == st.st_ctime_ns:  # the kernel's clock ticks coarsely
        time.sleep(0.005)
        os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    state = staging_check(host, str(staging), uniq, python=PY)
    assert big.sha256 not in state.present and not blob.exists()
    again = push(host, str(staging), files, cache, python=PY)
    assert again.files == 1 and hashlib.sha256(blob.read_bytes()).hexdigest() == big.sha256
