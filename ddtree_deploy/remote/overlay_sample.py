"""On an overlay's source: how well `zstd`, with the stream's flags, compresses the lane's data.

    python -c "$(this file)" SITE_PACKAGES SAMPLE_BYTES [ZSTD_FLAGS]   < [[path, size], ...]

Reads a sample (a slice from the middle of each of the eight largest files, paths relative to
site-packages) and times zstd over it (`zstd -T0 ZSTD_FLAGS`, the stream's own: default -1),
less the time of starting zstd. Prints {"zstd": bool,
"bytes": n, "compressed": m, "seconds": s, "cpu_seconds": c, "decompress_cpu_seconds": d,
"cpus": k, "load": l} ("bytes": 0 without zstd or files; {"zstd": false, "why": ...} where this
zstd fails on the flags or does not restore the sample): c and d are the CPU time (user and
system, less a start's) of `zstd` compressing the sample and of `zstd -d` restoring it, k and l
the CPUs this process may use and the load average over the last minute. Sent as it is (not
bundled): Python >= 3.8 syntax, stdlib only.
"""

from __future__ import annotations

import json
import os
import resource
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
    flags = argv[2].split() if len(argv) > 2 and argv[2].strip() else ["-1"]
    cmd = ["zstd", "-q", *flags, "-T0", "-c"]
    c0 = _children_cpu()
    t0 = time.monotonic()
    subprocess.run(cmd, input=b"", stdout=subprocess.PIPE)  # the cost of starting it
    t1 = time.monotonic()
    c1 = _children_cpu()
    proc = subprocess.run(cmd, input=data, capture_output=True)
    took = max((time.monotonic() - t1) - (t1 - t0), 1e-6)
    c2 = _children_cpu()
    back = subprocess.run(["zstd", "-q", "-d", "-c", *[f for f in flags if f.startswith("--long")]],
                          input=proc.stdout, capture_output=True)
    c3 = _children_cpu()
    if proc.returncode != 0 or not proc.stdout or back.returncode != 0 or back.stdout != data:
        # this zstd cannot run the stream's flags (an old build without --long, say): the
        # stream must not be compressed with them, so report it as no zstd, with the reason
        why = (proc.stderr or back.stderr or b"").decode("utf-8", "replace").strip()[-300:]
        print(json.dumps({"zstd": False, "bytes": 0, "why": why or "zstd failed on the sample"}))
        return 0
    start = c1 - c0
    print(json.dumps({"zstd": True, "bytes": len(data), "compressed": len(proc.stdout),
                      "seconds": took, "cpu_seconds": max(c2 - c1 - start, 0.0),
                      "decompress_cpu_seconds": max(c3 - c2 - start, 0.0),
                      "cpus": usable_cpus(), "load": os.getloadavg()[0]}))
    return 0


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; the machine's count where unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
