"""On an overlay's target, step 1: which staged blobs are already there with the right content.

    python -c "$(bundle)" STAGING   < [[sha256, size], ...]

Damaged blobs and half-received leftovers (incoming/) are deleted. A blob whose stat matches its
record in verified.jsonl (written by overlay_staging_receive.py as it arrived) is trusted, any
other one hashed again. Prints {"present": [...], "zstd": bool, "free": bytes}.
Bundled after overlay_staging.py: Python >= 3.8 syntax, stdlib only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys

from ddtree_deploy.remote.overlay_staging import guard


def main(argv: list[str]) -> int:
    staging = argv[0]
    guard(staging)
    blobs = os.path.join(staging, "blobs")
    incoming = os.path.join(staging, "incoming")
    want = json.load(sys.stdin)
    shutil.rmtree(incoming, ignore_errors=True)
    records = {}
    try:
        with open(os.path.join(staging, "verified.jsonl")) as rec:
            for line in rec:
                try:
                    r = json.loads(line)
                    records[r[0]] = tuple(r[1:5])
                except (ValueError, IndexError, TypeError):
                    continue
    except OSError:
        pass
    present = []
    for sha, size in want:
        path = os.path.join(blobs, sha)
        try:
            st = os.stat(path)
            if st.st_size != size:
                raise ValueError("size")
            if records.get(sha) == (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns):
                present.append(sha)  # verified when it arrived, untouched since
                continue
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                while True:
                    chunk = fh.read(1 << 20)
                    if not chunk:
                        break
                    digest.update(chunk)
            if digest.hexdigest() != sha:
                raise ValueError("hash")
            present.append(sha)
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                os.unlink(path)
    os.makedirs(blobs, exist_ok=True)
    free = shutil.disk_usage(staging).free
    print(json.dumps({"present": present, "zstd": shutil.which("zstd") is not None,
                      "free": free}))
    return 0
