"""On a host: the link probe's far end, toward this host or from it.

    python -c "$(this file)" SKIP   < random bytes     (toward this host: timed here)
    python - send N                                    (from this host: N random bytes out,
                                                        timed where they arrive)

Toward this host (SKIP): reads stdin to its end. The first SKIP bytes are not timed (the
connection's and the session's start, TCP's slow start, the bytes already buffered on the
way); the clock runs from the read that passed SKIP to the last one. Prints {"bytes": n,
"seconds": s, "received": r}: n bytes arrived in s seconds after the read that passed SKIP, r
bytes in all. Timing on the receiving side, on one clock, leaves out what the sender's side
adds (the session's setup, which on a fast link takes as long as the bytes: the old probe's
difference of two sends could come out zero or negative).

From this host (send N): writes N bytes, one random MiB over and over, and prints nothing
else; the workstation times them (overlay/wire.py `measure_link_down`).

Sent as it is (not bundled): Python >= 3.8 syntax, stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
import time


def send(n: int) -> int:
    """n bytes out: one random MiB over and over (making them would be slower than a fast
    link; a repeat 1 MiB apart is out of reach of ssh's compression, a 32 KiB window)."""
    block = os.urandom(1 << 20)
    out = sys.stdout.buffer
    while n > 0:
        out.write(block[:n])
        n -= min(n, len(block))
    out.flush()
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "send":
        return send(int(argv[1]))
    skip = int(argv[0])
    buf = bytearray(1 << 20)
    got = 0
    start = None
    counted = 0
    with open(sys.stdin.fileno(), "rb", buffering=0, closefd=False) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            got += n
            if start is None and got >= skip:
                start = time.monotonic()
                counted = got
    end = time.monotonic()
    if start is None:
        print(json.dumps({"bytes": 0, "seconds": 0.0, "received": got}))
        return 0
    print(json.dumps({"bytes": got - counted, "seconds": end - start, "received": got}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
