"""A first sampled request that stalls after its first token (JIT compiles) is warm-up.

Seen on a real H200 (rehearsal run 2, DFLASH, SGLang 0.5.11): the first token of the probe's
sampled generation came at once from prefill, then the verify step's sampling kernels compiled
for about 100 s. The host-side generation must wait that out while the warm-up budget lasts,
report the gap as ``stall_s``, and still give up once the budget is spent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ddtree_deploy.remote import health as remote


class _Stalling(BaseHTTPRequestHandler):
    stall_s = 2.6

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(1, 5):
            chunk = {"output_ids": list(range(10, 10 + i)),
                     "meta_info": {"completion_tokens": i}}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(self.stall_s if i == 1 else 0.05)  # the first token, then the stall
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stalling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_stall_after_the_first_token_is_covered_by_the_warm_up_budget(base: str) -> None:
    out = remote.generate(base, "", [1, 2], 4, {"temperature": 0.7}, 10.0, 0.5, "ids")
    assert not out["timed_out"] and out["tokens"] == 4
    assert out["stall_s"] >= _Stalling.stall_s - 0.2
    # the steady rate leaves the stall out: 3 tokens in well under the stall
    assert out["steady_tok_per_s"] > 3 / _Stalling.stall_s


def test_a_stall_past_the_warm_up_budget_times_out(base: str) -> None:
    out = remote.generate(base, "", [1, 2], 4, {"temperature": 0.7}, 1.5, 0.3, "ids")
    assert out["timed_out"] and not out.get("first_timed_out")
    assert out["tokens"] == 1
    assert out["stalled"]  # nothing after the first token: the probe asks again on warm-up time


class _Slow(_Stalling):
    """Slow throughout: every gap is past the limit (one stall is not a warm-up)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(1, 6):
            chunk = {"output_ids": list(range(10, 10 + i)), "meta_info": {"completion_tokens": i}}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.8)  # under the stall gap: a slow server, not a compile
        self.wfile.write(b"data: [DONE]\n\n")


def test_a_stream_slow_throughout_still_times_out_within_the_budget() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = remote.generate(f"http://127.0.0.1:{server.server_address[1]}", "", [1], 5,
                              {"temperature": 0.7}, 30.0, 0.5, "ids")
    finally:
        server.shutdown()
        server.server_close()
    assert out["timed_out"] and out["tokens"] == 2  # the first gap forgiven, the second not
    assert not out["stalled"]  # tokens kept coming: judged as slow, not asked again
