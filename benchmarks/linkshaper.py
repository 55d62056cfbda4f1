"""A shaped link in user space: a TCP forwarder with a token bucket for each direction.

For a benchmark on a machine where `tc` is not allowed (no CAP_NET_ADMIN): every connection
to 127.0.0.1:LISTEN is forwarded to 127.0.0.1:TARGET, and the bytes of all connections
together are held to RATE bytes per second each way, with a burst of BURST bytes (as
`tc qdisc ... tbf rate R burst B` does on a veth, except that the bucket counts TCP payload,
not frames: at the same nominal rate a little faster than tbf, about 5%). Both sides of a
comparison go through the same link, so their ratio is fair.

    python benchmarks/linkshaper.py LISTEN TARGET --rate 125000000 [--burst 262144]

Prints "ready" once it listens; runs until killed (SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time

CHUNK = 64 * 1024


class Bucket:
    """Tokens are bytes; `take(n)` returns once n bytes may go (sleeping outside the lock)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            self.tokens -= n  # may go negative: the debt is the wait, paid by this caller
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


def pump(src: socket.socket, dst: socket.socket, bucket: Bucket) -> None:
    try:
        while data := src.recv(CHUNK):
            bucket.take(len(data))
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def serve(listen: int, target: int, rate: float, burst: int) -> None:
    up, down = Bucket(rate, burst), Bucket(rate, burst)
    srv = socket.create_server(("127.0.0.1", listen), backlog=64)
    print("ready", flush=True)
    while True:
        client, _ = srv.accept()
        try:
            far = socket.create_connection(("127.0.0.1", target))
        except OSError:
            client.close()
            continue
        for s in (client, far):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threads = [threading.Thread(target=pump, args=(client, far, up), daemon=True),
                   threading.Thread(target=pump, args=(far, client, down), daemon=True)]
        for t in threads:
            t.start()
        threading.Thread(target=_close_after, args=(threads, client, far), daemon=True).start()


def _close_after(threads: list[threading.Thread], *socks: socket.socket) -> None:
    for t in threads:
        t.join()
    for s in socks:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("listen", type=int)
    ap.add_argument("target", type=int)
    ap.add_argument("--rate", type=float, required=True, help="bytes per second, each way")
    ap.add_argument("--burst", type=int, default=256 * 1024)
    args = ap.parse_args()
    serve(args.listen, args.target, args.rate, args.burst)


if __name__ == "__main__":
    main()
