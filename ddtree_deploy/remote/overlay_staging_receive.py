"""On an overlay's target, step 2: receive a tar of blobs (named by sha256) from stdin.

    python -c "$(bundle)" STAGING   < tar

Each blob is written to incoming/, hashed while it is written, and renamed into blobs/ only when
it matches; each one so verified is recorded in verified.jsonl with its size, inode, mtime and
ctime: the staging check and the apply trust a blob whose stat still matches its record (no
write, chmod, rename or replacement since: any of them changes the ctime, which no caller can set
back) and hash every other one again. So the bytes are read once, as they arrive. A blob has no
fsync of its own: its writing to disk starts at once, and a batch of blobs (overlay_durable.py:
256 MiB, and the last) is made durable by one syncfs before any of them is renamed and recorded,
so a blob's name and record only ever stand for bytes on disk; this happens in a thread of its
own while the next blob is read. The tar is the
workstation's (from its cache) or the source's own (forwarded while it arrives: its "pid" member
is skipped). Prints {"ok": [...], "bad": [...], "complete": bool, "error": str or null}.
Bundled after overlay_staging.py and overlay_durable.py: Python >= 3.8 syntax, stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import sys
import tarfile
import threading
from collections.abc import Callable
from typing import Any

from ddtree_deploy.remote.overlay_durable import Batch
from ddtree_deploy.remote.overlay_staging import guard
from ddtree_deploy.remote.overlay_tar_read import TarReader


def main(argv: list[str]) -> int:
    staging = argv[0]
    guard(staging)
    blobs = os.path.join(staging, "blobs")
    incoming = os.path.join(staging, "incoming")
    os.makedirs(blobs, exist_ok=True)
    os.makedirs(incoming, exist_ok=True)
    ok: list[str] = []
    bad: list[str] = []
    complete = False
    errors: list[str] = []  # the first error
    finished: queue.Queue[Any] = queue.Queue(8)  # written and hashed: published, overlapped
    batch = Batch(incoming)
    record = os.path.join(staging, "verified.jsonl")

    def publisher(part: str, sha: str) -> Callable[[], None]:
        def publish() -> None:  # after the batch's sync: its bytes are on disk
            os.replace(part, os.path.join(blobs, sha))
            st = os.stat(os.path.join(blobs, sha))
            with open(record, "a") as rec:
                rec.write(json.dumps([sha, st.st_size, st.st_ino, st.st_mtime_ns,
                                      st.st_ctime_ns]) + "\n")
            ok.append(sha)

        return publish

    def finish() -> None:
        while True:
            item = finished.get()
            if item is None:
                break
            fh, part, sha, good = item
            try:
                fh.flush()
                if good:
                    batch.written(fh.fileno())
                    size = os.fstat(fh.fileno()).st_size
                    fh.close()
                    batch.add(part, size, publisher(part, sha))
                    if batch.full():
                        batch.flush()
                else:
                    fh.close()
                    os.unlink(part)
                    bad.append(sha)
            except OSError as exc:
                if not errors:
                    errors.append(f"{type(exc).__name__}: {exc}")
        try:
            batch.flush()  # the last blobs, also when the stream broke off: verified ones stay
        except OSError as exc:
            if not errors:
                errors.append(f"{type(exc).__name__}: {exc}")

    finisher = threading.Thread(target=finish)
    finisher.start()
    error = None
    try:
        tar = TarReader(sys.stdin.buffer)  # each byte read once, into one buffer
        for member in tar:
            if member.name == "end":
                complete = True
                break
            if member.name == "pid":  # a source's stream, forwarded as it came: not a blob
                continue
            sha = member.name
            if len(sha) != 64 or sha.strip("0123456789abcdef") or not member.isfile():
                bad.append(sha)
                continue
            part = os.path.join(incoming, sha + ".part")
            digest = hashlib.sha256()
            fh = open(part, "wb")  # noqa: SIM115 - closed by the finisher
            size = 0
            try:
                for chunk in tar.content(member):
                    digest.update(chunk)
                    fh.write(chunk)
                    size += len(chunk)
            except BaseException:
                fh.close()
                raise
            finished.put((fh, part, sha, digest.hexdigest() == sha and size == member.size))
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finished.put(None)
    finisher.join()
    if error is None and errors:
        error = errors[0]
    print(json.dumps({"ok": ok, "bad": bad, "complete": complete, "error": error}))
    return 0
