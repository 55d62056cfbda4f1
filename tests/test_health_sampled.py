"""The probe's sampled generation, its warm-up budget and token-id mode (issue 12, defect 5).

Against a small stdlib server started here on 127.0.0.1 that answers like SGLang 0.5.11 does
(tests/facts/real/sglang-0.5.11-h200/ has the real answers): /generate streams
`data: {...}` chunks with meta_info.completion_tokens; a server started with
--skip-tokenizer-init says so in /server_info, refuses a text prompt with the real message
(streamed as an error chunk, as http_server.py does for a ValueError) and answers input_ids
with output_ids. Its "jit" mode stalls the FIRST sampled request that reaches the sampling
kernels (top-p/top-k) before its first token, as flashinfer's JIT compile did on a real H200.
The probe runs for real over LocalTransport (remote.py as `python3 -`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.errors import UsageError
from ddtree_deploy.health import ProbeTarget, probe_service
from ddtree_deploy.health.check import SAMPLING, judge_generation
from ddtree_deploy.transport.local import LocalTransport

SERVER = r'''
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
mode, port, stall = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ids_only = mode in ("ids", "ids-noinfo", "nan")
lock = threading.Lock()
seen = {"sampled": 0}
REFUSAL = ("The engine initialized with skip_tokenizer_init=True cannot accept text prompts. "
           "Please provide input_ids or re-initialize the engine with skip_tokenizer_init=False.")
print("server up", flush=True)
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def send(self, code, body=b""):
        self.send_response(code); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def chunk(self, obj):
        self.raw(b"data: " + json.dumps(obj).encode() + b"\n\n")
    def raw(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data)); self.wfile.flush()
    def do_GET(self):
        if self.path == "/health":
            return self.send(200)
        if self.path == "/v1/models":
            return self.send(200, json.dumps({"data": [{"id": "tiny"}]}).encode())
        if self.path == "/server_info" and mode != "ids-noinfo":
            return self.send(200, json.dumps({"skip_tokenizer_init": ids_only,
                                              "sampling_backend": "flashinfer"}).encode())
        self.send(404)
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        params = body["sampling_params"]
        n = params["max_new_tokens"]
        kernels = params.get("temperature", 1.0) > 0 and ("top_p" in params or "top_k" in params)
        print(f"POST {sorted(body)} {json.dumps(params, sort_keys=True)}", flush=True)
        self.send_response(200); self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
        if ids_only and "input_ids" not in body:
            self.chunk({"error": {"message": REFUSAL}})
        elif kernels and mode == "nosample":
            self.chunk({"error": {"message": "sampling kernel failed"}})
        else:
            with lock:
                first_sampled = kernels and seen["sampled"] == 0
                seen["sampled"] += kernels
            if first_sampled and mode == "jit":
                time.sleep(stall)  # the sampling kernels compile on first use
            out = []
            for i in range(n):
                if kernels and (mode == "hang" and i == 5 or mode == "hang1" and i == 1):
                    time.sleep(stall)  # DFLASH's sampled verify on dummy weights: never returns
                tok = 0 if mode == "nan" else 100 + (i * 7) % 50
                out.append(tok)
                meta = {"completion_tokens": i + 1, "prompt_tokens": 6}
                if ids_only:
                    self.chunk({"output_ids": list(out), "meta_info": meta})
                else:
                    self.chunk({"text": " ".join(f"w{t}" for t in out), "meta_info": meta})
                time.sleep(0.005)
        self.raw(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n"); self.wfile.flush()
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, tmp: Path, mode: str, stall: float = 0.0) -> None:
        script = tmp / "server.py"
        script.write_text(SERVER)
        self.log = tmp / f"{mode}.log"
        self.port = _free_port()
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, str(script), mode, str(self.port), str(stall)],
                stdout=out, stderr=subprocess.STDOUT)

    def target(self) -> ProbeTarget:
        return ProbeTarget(port=self.port, pid=self.popen.pid, log_file=str(self.log))

    def requests(self) -> list[str]:
        return [ln for ln in self.log.read_text().splitlines() if ln.startswith("POST ")]

    def stop(self) -> None:
        self.popen.kill()
        self.popen.wait()


@pytest.fixture()
def start(tmp_path: Path) -> Iterator[Any]:
    servers: list[Server] = []

    def make(mode: str, stall: float = 0.0) -> Server:
        server = Server(tmp_path, mode, stall)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def _probe(server: Server, deadline: float = 20.0, **kw: Any) -> dict[str, Any]:
    verdict = probe_service(LocalTransport(), server.target(), deadline_s=deadline, sudo=False,
                            **kw)
    return verdict.to_json()


def test_healthy_needs_a_greedy_and_a_sampled_generation(start: Any) -> None:
    server = start("text")
    v = _probe(server)
    assert v["status"] == "healthy", v
    greedy, sampled = v["http"]["greedy"], v["http"]["sampled"]
    assert greedy["tokens"] == 16 and greedy["sampling"] == {"temperature": 0}
    assert sampled["tokens"] == 8 and sampled["sampling"] == SAMPLING
    assert v["http"]["tokens"] == 16  # the greedy one, where it always was
    assert v["http"]["input_mode"] == "text" and v["http"]["sampling_backend"] == "flashinfer"
    assert "greedy 16 tokens" in v["reason"] and "sampled 8 tokens" in v["reason"]
    # what reached the server: the greedy request, then the sampled one with top-p/top-k
    posts = server.requests()
    assert len(posts) == 2 and '"temperature": 0}' in posts[0]
    assert '"top_k": 20' in posts[1] and '"top_p": 0.9' in posts[1] and "0.7" in posts[1]
    assert 0 <= v["warmup_s"] < v["warmup_budget_s"] == 300.0
    json.dumps(v)


def test_a_failing_sampled_generation_is_unhealthy(start: Any) -> None:
    v = _probe(start("nosample"))
    assert v["status"] == "unhealthy" and v["exit_code"] == 1, v
    assert "the sampled generation failed: sampling kernel failed" in v["reason"]
    assert v["http"]["greedy"]["tokens"] == 16  # greedy alone was fine: not enough


def test_no_sampled_generation_when_asked_for_none(start: Any) -> None:
    server = start("nosample")
    v = _probe(server, sample_tokens=0)
    assert v["status"] == "healthy" and v["http"]["sampled"] is None, v
    assert len(server.requests()) == 1


def test_first_sampled_stall_is_warm_up_not_the_deadline(start: Any) -> None:
    server = start("jit", stall=4.0)
    v = _probe(server, deadline=3.0, warmup_s=60.0)
    # 4 s of stall exceed the 3 s deadline: only charging it to warm-up makes this healthy
    assert v["status"] == "healthy", v
    assert v["http"]["sampled"]["first_token_s"] >= 4.0
    assert v["warmup_s"] >= 4.0 and v["warmup_budget_s"] == 60.0
    assert "warm-up" in v["reason"]


def test_a_sampled_generation_stuck_mid_way_is_unhealthy_with_what_was_seen(start: Any) -> None:
    """A real H200 DFLASH server on dummy weights gave 6 of 8 sampled tokens, then nothing
    (rehearsal run 5): greedy had answered, so the verdict says the sampling path stalled."""
    v = _probe(start("hang", stall=120.0), deadline=25.0, warmup_s=2.0)
    assert v["status"] == "unhealthy" and v["exit_code"] == 1, v
    assert v["reason"].startswith("the sampled generation gave 5 of 8 tokens"), v["reason"]
    assert v["http"]["greedy"]["tokens"] == 16
    hint = [d for d in v["diagnosis"] if d["id"] == "sampled-path-stalled"]
    assert len(hint) == 1 and not hint[0]["fatal"]
    assert "greedy requests answered" in hint[0]["diagnosis"]
    assert "--warmup" in hint[0]["remedy"]


def test_a_sampled_generation_stuck_after_its_first_token_says_so_when_warm_up_ends(
        start: Any) -> None:
    """The first token came, then nothing: asked again on warm-up time (it may be a JIT
    compile), and when that runs out the verdict says what happened, not 'no first token'; the
    CLI shows the hint and still the server's last log lines."""
    server = start("hang1", stall=120.0)
    v = _probe(server, deadline=25.0, warmup_s=2.0)
    assert v["status"] == "deadline" and v["exit_code"] == 124, v
    assert v["reason"] == ("the sampled generation gave its first token, then nothing more "
                           "within the warm-up budget of 2 s")
    hint = [d for d in v["diagnosis"] if d["id"] == "sampled-path-stalled"]
    assert len(hint) == 1 and hint[0]["line"] == ""
    cli = Path(sys.executable).parent / "ddtree-deploy"
    text = subprocess.run([str(cli), "probe", "localhost", "--port", str(server.port), "--pid",
                           str(server.popen.pid), "--log-file", str(server.log), "--deadline",
                           "25", "--warmup", "2"], capture_output=True, text=True, check=False,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
    assert text.returncode == 124, text.stderr
    assert "greedy requests answered" in text.stdout and "log: " not in text.stdout
    assert "last log lines:" in text.stdout and "POST " in text.stdout  # the tail, still shown


def test_warm_up_budget_runs_out(start: Any) -> None:
    v = _probe(start("jit", stall=30.0), deadline=20.0, warmup_s=1.5)
    assert v["status"] == "deadline" and v["exit_code"] == 124, v
    assert v["reason"] == ("no first token of the sampled generation within the warm-up "
                           "budget of 1.5 s")
    assert v["warmup_s"] == pytest.approx(1.5, abs=0.3)


@pytest.mark.parametrize("mode", ["ids", "ids-noinfo"])
def test_token_id_mode(start: Any, mode: str) -> None:
    """--skip-tokenizer-init: from /server_info, or (without it) from the text refusal."""
    server = start(mode)
    v = _probe(server)
    assert v["status"] == "healthy", v
    assert v["http"]["input_mode"] == "ids"
    for kind, n in (("greedy", 16), ("sampled", 8)):
        gen = v["http"][kind]
        assert gen["mode"] == "ids" and gen["tokens"] == n
        assert gen["ids_sample"][:3] == [100, 107, 114]
    posts = server.requests()
    assert all("'input_ids'" in p for p in posts[-2:])
    if mode == "ids":
        assert len(posts) == 2  # known from /server_info: no text request at all
    else:
        assert len(posts) == 3 and "'text'" in posts[0]  # refused once, then input_ids


def test_token_id_mode_known_from_the_deployment(start: Any) -> None:
    server = start("ids-noinfo")
    target = server.target()
    verdict = probe_service(LocalTransport(), ProbeTarget(
        port=target.port, pid=target.pid, log_file=target.log_file, input_ids=True),
        deadline_s=20, sudo=False)
    assert verdict.status == "healthy", verdict.to_json()
    assert all("'input_ids'" in p for p in server.requests())


def test_token_id_zero_repeated_is_degenerate(start: Any) -> None:
    v = _probe(start("nan"))
    assert v["status"] == "unhealthy", v
    assert "token id 0 repeated" in v["reason"]
    assert v["http"]["greedy"]["ids_sample"][:4] == [0, 0, 0, 0]


def test_rate_after_a_slow_first_token_is_the_steady_one() -> None:
    # an early stop (3 of 16) after a 100 s first token: steady 30 tok/s is fine
    warm = {"asked": 16, "tokens": 3, "seconds": 100.1, "tok_per_s": 0.03,
            "steady_tok_per_s": 20.0, "first_s": 100.0, "text": "a b c"}
    assert judge_generation(warm, 2.0) is None
    assert "very low rate" in (judge_generation({**warm, "steady_tok_per_s": 0.5}, 2.0) or "")


def test_bad_warm_up_budget_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="warm-up"):
        probe_service(LocalTransport(), ProbeTarget(port=1), deadline_s=1, warmup_s=0)


def test_cli_probe_reports_the_warm_up(start: Any) -> None:
    server = start("jit", stall=2.0)
    cli = Path(sys.executable).parent / "ddtree-deploy"
    args = [str(cli), "probe", "localhost", "--port", str(server.port), "--pid",
            str(server.popen.pid), "--log-file", str(server.log), "--deadline", "20"]
    text = subprocess.run([*args, "--warmup", "60"], capture_output=True, text=True, check=False,
                          env={**os.environ, "NO_COLOR": "1"})
    assert text.returncode == 0, text.stderr
    assert "healthy after" in text.stdout and "s of it warming up): /health 200" in text.stdout
    warm = float(text.stdout.split("(")[1].split("s of it")[0])
    assert warm >= 2.0  # the first sampled request's stall
    again = subprocess.run([*args, "--json"], capture_output=True, text=True, check=False)
    v = json.loads(again.stdout)["results"]  # docs/json.md
    assert again.returncode == 0 and v["status"] == "healthy"
    assert v["warmup_budget_s"] == 300.0 and v["warmup_s"] < 2.0  # compiled already


REAL = Path(__file__).parent / "facts" / "health"


def test_probe_reads_real_sglang_answers_in_token_id_mode() -> None:
    """The bodies a real 0.5.11 server gave (tests/facts/health/SOURCES.txt), replayed."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = {name: (REAL / f"{name}.json").read_bytes()
              for name in ("greedy", "server_info", "v1_models")}
    posts: list[dict[str, Any]] = []

    class Replay(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            routes = {"/health": b"", "/server_info": bodies["server_info"],
                      "/v1/models": bodies["v1_models"]}
            self._send(200, routes[self.path]) if self.path in routes else self._send(404, b"")

        def do_POST(self) -> None:
            posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self._send(200, bodies["greedy"])

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        verdict = probe_service(LocalTransport(), ProbeTarget(port=httpd.server_address[1]),
                                deadline_s=20, sudo=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
    v = verdict.to_json()
    assert v["status"] == "healthy", v
    assert v["http"]["model_id"] == "/tmp/smoke/target"
    assert v["http"]["input_mode"] == "ids" and v["http"]["sampling_backend"] == "flashinfer"
    for kind in ("greedy", "sampled"):
        assert v["http"][kind]["tokens"] == 32  # meta_info.completion_tokens of the answer
        assert v["http"][kind]["ids_sample"][:4] == [730, 912, 730, 912]
    assert [sorted(p) for p in posts] == [["input_ids", "sampling_params", "stream"]] * 2
    assert posts[1]["sampling_params"] == {"max_new_tokens": 8, **SAMPLING}
