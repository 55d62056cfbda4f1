"""On a host: the link probe's far end, toward this host or from it.

    python -c "$(this file)" SKIP   < random bytes     (toward this host: timed here)
    python - send N                                    (from this host: N random bytes out,
                                                        timed where they arrive)

Toward this host (SKIP): reads stdin to its end. The first SKIP bytes are not timed (the
connection's and the session's start, TCP's slow start, the bytes already buffered on the
way); the clock runs from the read that passed SKIP to the last one (`Arrivals`). Prints
{"bytes": n, "seconds": s, "received": r}: n bytes arrived in s seconds after the read that
passed SKIP, r bytes in all. Timing on the receiving side, on one clock, leaves out what the
sender's side adds (the session's setup, which on a fast link takes as long as the bytes: the
old probe's difference of two sends could come out zero or negative).

From this host (send N): writes N bytes, one random MiB over and over, and prints nothing
else; the workstation times them with the same `Arrivals` (overlay/wire.py
`measure_link_down`).

Sent as it is (not bundled): Python >= 3.8 syntax, stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable


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


class Arrivals:
    """Bytes as they arrive (`write`): all of them counted, those after the first `skip`
    timed on `clock`, from the arrival that passed it to the last one. Used here (toward this
    host) and by the workstation for the bytes `send` writes (overlay/wire.py)."""

    def __init__(self, skip: int, clock: Callable[[], float] | None = None) -> None:
        self.skip, self.clock = skip, clock or time.monotonic
        self.got = self.counted = 0
        self.start: float | None = None
        self.end = 0.0

    def write(self, data: bytes | memoryview) -> int:
        self.got += len(data)
        if self.start is not None:
            self.end = self.clock()
        elif self.got >= self.skip:
            self.start = self.end = self.clock()
            self.counted = self.got
        return len(data)

    def answer(self) -> dict:
        """{"bytes": n, "seconds": s, "received": r}: n bytes timed over s seconds, r in all."""
        if self.start is None:
            return {"bytes": 0, "seconds": 0.0, "received": self.got}
        return {"bytes": self.got - self.counted, "seconds": self.end - self.start,
                "received": self.got}


def main(argv: list[str]) -> int:
    if argv[0] == "send":
        return send(int(argv[1]))
    arrivals = Arrivals(int(argv[0]))
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(sys.stdin.fileno(), "rb", buffering=0, closefd=False) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            arrivals.write(view[:n])
    print(json.dumps(arrivals.answer()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
