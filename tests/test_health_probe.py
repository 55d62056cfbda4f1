"""probe_service over LocalTransport against REAL processes (no systemd on this workstation).

The remote poll script runs for real (python3 - ARGS, one exec per poll), finds no running
systemd, reports so, and falls back to the PID and log file the caller gives. Servers: the
lab's stand-in SGLang server (real sglang 0.5.11 wheel; tests/test_standin_server.py builds
its venv) and a tiny stdlib HTTP server started here on 127.0.0.1 for the bad outputs.
The systemd path is exercised in the lab containers (ProbeTarget(unit=...), no pid).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_standin_server import (  # noqa: F401 (lab is a fixture)
    GOOD,
    SM120,
    _env,
    _free_port,
    _models,
    _spec,
    lab,
)

from ddtree_deploy.errors import UsageError
from ddtree_deploy.health import ProbeTarget, probe_service, scan
from ddtree_deploy.health.check import judge_generation
from ddtree_deploy.remote.runner import RemoteScriptError
from ddtree_deploy.transport.local import LocalTransport

TINY = r'''
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
mode, port, warm = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
t0 = time.monotonic()
print("tiny server starting", flush=True)
if mode == "die":
    time.sleep(warm)
    print("something went wrong without a known text", flush=True)
    sys.exit(3)
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def send(self, code, body=b"", ctype="application/json"):
        self.send_response(code); self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def refused(self):  # "auth": SGLang's API-key middleware (/health* always allowed)
        if mode == "auth" and not self.path.startswith("/health") and \
                self.headers.get("Authorization") != "Bearer sk-tiny":
            self.send(401, b'{"error": "Unauthorized"}')
            return True
        return False
    def do_GET(self):
        if self.refused():
            return
        ready = mode != "never" and time.monotonic() - t0 >= warm
        if self.path == "/health":
            return self.send(200 if ready else 503)
        if self.path == "/v1/models":
            return self.send(200, json.dumps({"data": [{"id": "tiny-model"}]}).encode())
        self.send(404)
    def do_POST(self):
        if self.refused():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["sampling_params"]["max_new_tokens"]
        if mode == "bang":
            return self.send(200, json.dumps({"text": "!" * n,
                "meta_info": {"completion_tokens": n}}).encode())
        if mode == "slowjson":
            time.sleep(2.0)
            return self.send(200, json.dumps({"text": " the", "meta_info":
                {"completion_tokens": 1}}).encode())
        if mode == "slowstream":
            self.send_response(200); self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(n):
                time.sleep(1.0)
                chunk = {"text": " w" * (i + 1), "meta_info": {"completion_tokens": i + 1}}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            return
        self.send(200, json.dumps({"text": " ".join(["word"] * n),
                                   "meta_info": {"completion_tokens": n}}).encode())
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


class Proc:
    """A started server: its PID, log file and the moment it exited (watched by a thread)."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.exited_at: float | None = None
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        self.popen.wait()
        self.exited_at = time.monotonic()

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


@pytest.fixture()
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


def _tiny(procs: list[Proc], tmp_path: Path, mode: str, warm: float = 0.5) -> ProbeTarget:
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    port = _free_port()
    proc = Proc([sys.executable, str(script), mode, str(port), str(warm)], tmp_path / "tiny.log")
    procs.append(proc)
    return ProbeTarget(port=port, pid=proc.popen.pid, log_file=str(proc.log), name="tiny")


def _probe(target: ProbeTarget, deadline: float, **kw: object) -> tuple[object, list[str]]:
    seen: list[str] = []
    verdict = probe_service(LocalTransport(), target, deadline_s=deadline,
                            on_status=seen.append, sudo=False, **kw)  # type: ignore[arg-type]
    return verdict, seen


# -- the real stand-in SGLang server -------------------------------------------------------


def _standin(lab: dict[str, Path], procs: list[Proc], tmp_path: Path,  # noqa: F811
             pkgs: list[str]) -> ProbeTarget:
    port = _free_port()
    env = _env(lab, pkgs, _spec(lab["root"], SM120), CUDA_VISIBLE_DEVICES="0",
               DDTREE_LAB_GPU_CLAIMS=str(tmp_path / "claims"))
    argv = [str(lab["venv"] / "bin/python"), "-m", "sglang.launch_server", *_models(lab),
            "--host", "127.0.0.1", "--port", str(port), "--mem-fraction-static", "0.8",
            "--attention-backend", "triton"]
    proc = Proc(argv, tmp_path / "sglang.log", env)
    procs.append(proc)
    return ProbeTarget(port=port, unit="sglang-ddtree.service", pid=proc.popen.pid,
                       log_file=str(proc.log), host="ct200", venv="/root/venv_sglang")


def test_healthy_standin_after_warmup(lab: dict[str, Path], procs: list[Proc],  # noqa: F811
                                      tmp_path: Path) -> None:
    target = _standin(lab, procs, tmp_path, GOOD)
    first_200: list[float] = []

    def watch() -> None:  # an independent observer of /health, every 50 ms
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        end = time.monotonic() + 60
        while time.monotonic() < end and not first_200:
            try:
                with opener.open(f"http://127.0.0.1:{target.port}/health", timeout=1) as r:
                    if r.status == 200:
                        first_200.append(time.monotonic())
            except OSError:
                pass
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    verdict, seen = _probe(target, 60)
    done = time.monotonic()
    assert verdict.status == "healthy", verdict.to_json()  # type: ignore[attr-defined]
    v = verdict.to_json()  # type: ignore[attr-defined]
    assert v["exit_code"] == 0 and v["diagnosis"] == []
    assert v["unit"]["systemd"] is False and v["unit"]["note"] == "systemd unavailable"
    assert v["http"]["health"] == 200 and v["http"]["model_id"].endswith("Qwen3.6-27B")
    assert v["http"]["tokens"] and 0 < v["http"]["tokens"] <= 16
    assert v["http"]["tok_per_s"] > 2 and v["http"]["text_sample"].strip()
    assert any("/health 503" in s or "/health" in s for s in seen)  # it waited while warming
    # healthy only once /health had answered 200 to an independent observer (no timing bound:
    # the machines are shared; the probe's own deadline is what bounds it)
    assert first_200 and first_200[0] <= done
    lines = Path(target.log_file or "").read_text().splitlines()
    assert any("fired up" in line for line in lines) and scan(lines) == []
    json.dumps(v)


def test_crash_with_signature_within_two_seconds_of_exit(
        lab: dict[str, Path], procs: list[Proc], tmp_path: Path) -> None:  # noqa: F811
    pkgs = [p for p in GOOD if p != "xg-0.1.32"] + ["xg-0.1.10"]
    target = _standin(lab, procs, tmp_path, pkgs)
    verdict, _ = _probe(target, 60)
    at = time.monotonic()
    v = verdict.to_json()  # type: ignore[attr-defined]
    assert v["status"] == "unhealthy" and v["exit_code"] == 1
    assert v["diagnosis"][0]["id"] == "xgrammar-no-structural-tag"
    assert "--grammar-backend none" in v["diagnosis"][0]["remedy"]
    assert "StructuralTag" in v["diagnosis"][0]["line"]
    deadline = time.monotonic() + 10
    while procs[-1].exited_at is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs[-1].exited_at is not None and at - procs[-1].exited_at <= 2.0


# -- the tiny server ----------------------------------------------------------------------


def test_exit_without_signature_is_unhealthy_fast(procs: list[Proc], tmp_path: Path) -> None:
    target = _tiny(procs, tmp_path, "die", warm=0.8)
    verdict, _ = _probe(target, 30)
    v = verdict.to_json()  # type: ignore[attr-defined]
    # fail-fast: a verdict from the exit itself, not the deadline ("deadline", exit 124)
    assert v["status"] == "unhealthy" and "exited" in v["reason"] and v["diagnosis"] == []
    assert f"the process {procs[0].popen.pid} exited" in v["reason"]
    assert "something went wrong without a known text" in v["log_tail"]
    assert procs[0].exited_at is not None


def test_deadline_exit_124(procs: list[Proc], tmp_path: Path) -> None:
    target = _tiny(procs, tmp_path, "never")
    t0 = time.monotonic()
    verdict, seen = _probe(target, 1.5)
    took = time.monotonic() - t0
    assert verdict.status == "deadline" and verdict.exit_code == 124  # type: ignore[attr-defined]
    reason = verdict.reason  # type: ignore[attr-defined]
    # the deadline says what the last poll met, never only that time ran out
    assert reason.startswith("no verdict within 1.5 s; last seen: /health answered 503"), reason
    assert took >= 1.5  # it did not give up before the deadline
    assert len(seen) >= 2 and all("/health" in s for s in seen)


def test_degenerate_output_is_unhealthy(procs: list[Proc], tmp_path: Path) -> None:
    verdict, _ = _probe(_tiny(procs, tmp_path, "bang"), 20)
    v = verdict.to_json()  # type: ignore[attr-defined]
    assert v["status"] == "unhealthy" and "degenerate" in v["reason"]
    assert v["http"]["text_sample"].startswith("!!!!!!!!") and v["http"]["model_id"] == "tiny-model"


def test_good_tiny_output_is_healthy(procs: list[Proc], tmp_path: Path) -> None:
    verdict, _ = _probe(_tiny(procs, tmp_path, "good"), 20, generate_tokens=8)
    v = verdict.to_json()  # type: ignore[attr-defined]
    assert v["status"] == "healthy" and v["http"]["tokens"] == 8, v


@pytest.mark.parametrize("mode", ["slowjson", "slowstream"])
def test_very_slow_generation_is_unhealthy(procs: list[Proc], tmp_path: Path, mode: str) -> None:
    verdict, _ = _probe(_tiny(procs, tmp_path, mode), 6)
    v = verdict.to_json()  # type: ignore[attr-defined]
    assert v["status"] == "unhealthy", v
    assert v["http"]["tokens"] is not None and v["http"]["tokens"] < 8
    assert v["http"]["tok_per_s"] < 2
    if mode == "slowstream":
        # The server streams all 16 tokens, one a second. Had the probe waited for the end it
        # would have outlived the poll's own timeout (a "deadline" verdict): it stopped reading
        # when the deadline's budget ran out and judged the tokens it had.
        assert v["http"]["asked"] == 16 and v["http"]["tokens"] < v["http"]["asked"], v
    else:
        assert "far fewer tokens than asked at a very low rate" in v["reason"], v


def test_judge_generation_story_numbers() -> None:
    story = {"asked": 64, "tokens": 8, "seconds": 141.0, "tok_per_s": 8 / 141, "text": "a b c"}
    assert "very low rate" in (judge_generation(story, 2.0) or "")
    fine = {"asked": 16, "tokens": 16, "seconds": 0.2, "tok_per_s": 80.0, "text": "one two"}
    assert judge_generation(fine, 2.0) is None
    eos = {"asked": 16, "tokens": 3, "seconds": 0.05, "tok_per_s": 60.0, "text": "Yes."}
    assert judge_generation(eos, 2.0) is None  # an early stop at a good rate is fine


def test_bad_deadline_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        probe_service(LocalTransport(), ProbeTarget(port=1), deadline_s=0)


def test_a_server_with_an_api_key_is_probed_with_it(procs: list[Proc], tmp_path: Path) -> None:
    """The key is read on the host from the service's --config file (issue 30, item 6)."""
    target = _tiny(procs, tmp_path, "auth")
    refused, _ = _probe(target, 20)
    assert refused.status == "unhealthy" and "401" in refused.reason  # type: ignore[attr-defined]
    key = tmp_path / "server.yaml"
    key.write_text('api-key: "sk-tiny"\n')
    healthy, _ = _probe(dataclasses.replace(target, key_file=str(key)), 20)
    assert healthy.status == "healthy", healthy.reason  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", ["folder", "not-utf8", "bad-json", "missing"])
def test_an_unreadable_key_file_is_a_clear_error_not_a_traceback(
        procs: list[Proc], tmp_path: Path, case: str) -> None:
    """The host-side poll names the file and what it must hold, exits 2, and the workstation
    raises the tool's error with that text (before: the poll's traceback was the message)."""
    target = _tiny(procs, tmp_path, "auth")
    key = tmp_path / "server.yaml"
    if case == "folder":
        key.mkdir()
    elif case == "not-utf8":
        key.write_bytes(b'api-key: "\xff\xfe"\n')
    elif case == "bad-json":
        key.write_text('api-key: "sk-unterminated\n')
    with pytest.raises(RemoteScriptError) as caught:
        _probe(dataclasses.replace(target, key_file=str(key)), 20)
    message = str(caught.value)
    assert "(exit 2)" in message and "Traceback" not in message, message
    assert f"cannot read the API key from the service's --config file {str(key)!r}" in message
    assert "api-key:" in message
