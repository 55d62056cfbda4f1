"""On an overlay's source: how well `zstd -1 -T0` compresses the lane's own data, and how fast.

    python -c "$(this file)" SITE_PACKAGES SAMPLE_BYTES   < [[path, size], ...]

Reads a sample (a slice from the middle of each of the eight largest files, paths relative to
site-packages) and times zstd over it, less the time of starting zstd. Prints {"zstd": bool,
"bytes": n, "compressed": m, "seconds": s} ("bytes": 0 without zstd or files). Sent as it is
(not bundled): Python >= 3.8 syntax, stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    sp, budget = argv[0], int(argv[1])
    files = sorted(json.load(sys.stdin), key=lambda f: -f[1])[:8]
    if shutil.which("zstd") is None or not files:
        print(json.dumps({"zstd": shutil.which("zstd") is not None, "bytes": 0}))
        return 0
    each = max(budget // len(files), 1 << 16)
    parts = []
    for rel, size in files:
        try:
            with open(os.path.normpath(os.path.join(sp, rel)), "rb") as fh:
                fh.seek(max(0, size // 2 - each // 2))
                parts.append(fh.read(each))
        except OSError:
            pass
    data = b"".join(parts)
    cmd = ["zstd", "-q", "-1", "-T0", "-c"]
    t0 = time.monotonic()
    subprocess.run(cmd, input=b"", stdout=subprocess.PIPE)  # the cost of starting it
    t1 = time.monotonic()
    proc = subprocess.run(cmd, input=data, stdout=subprocess.PIPE)
    took = max((time.monotonic() - t1) - (t1 - t0), 1e-6)
    print(json.dumps({"zstd": True, "bytes": len(data), "compressed": len(proc.stdout),
                      "seconds": took}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
