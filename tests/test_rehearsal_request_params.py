"""A CPU dry run of the request-parameter phase (rehearsal/request_params.py) against fakes.

Each fake server answers /generate and /v1/completions the way SGLang does in token-id mode
(statuses, JSON shapes, server-sent events), from the ladder design's closed-form greedy path and
a fixed bigram law for sampling. The DDTREE fakes admit requests with the real shared admission
(payload/ddtree/admission.py); the two negative controls do what their faults do (top-k ignored
in batches of unset rows; penalties let through and ignored). The phase must pass the real
ones and fail both controls; what this cannot show (SGLang's own behaviour) is the GPU call's.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "payload"))

from ddtree import admission  # noqa: E402

from rehearsal import checks, request_params  # noqa: E402
from rehearsal.designs import expected, get_design  # noqa: E402

LAD = get_design("ladder")
LOGITS = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(2)) * 6
PENALISED = ("frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens")


def _tokens(mode: str, ids: list[int], sp: dict[str, Any], rng: random.Random) -> list[int]:
    n = int(sp.get("max_new_tokens", 128))
    temperature = float(sp.get("temperature", 1.0))
    neutral = {k: 1.0 if k == "repetition_penalty" else 0.0 for k in PENALISED}
    penalised = mode == "nospec" and any(float(sp.get(k, neutral[k])) != neutral[k]
                                         for k in PENALISED)
    if temperature == 0.0:
        out = expected(LAD, ids, n)
        if penalised:  # what a penalty does to the greedy path, in the fake: changes it
            out = [t if i % 3 else 10 + (t % 50) for i, t in enumerate(out)]
    else:
        top_k = int(sp.get("top_k", -1))
        if mode == "topkfault" and float(sp.get("top_p", 1)) == 1 and not sp.get("min_p"):
            top_k = -1  # the old shortcut: the whole vocabulary
        out, prev = [], ids[-1]
        for _ in range(n):
            law = checks.filtered_probs(torch.softmax(LOGITS[prev:prev + 1] / temperature, -1),
                                        top_k=top_k, top_p=float(sp.get("top_p", 1.0)),
                                        min_p=float(sp.get("min_p", 0.0)))[0]
            prev = int(torch.multinomial(law, 1, generator=torch.Generator().manual_seed(
                rng.randrange(1 << 30))))
            out.append(prev)
    stops = sp.get("stop_token_ids") or []
    for i, t in enumerate(out):
        if t in stops:
            return out[:i + 1]
    return out


class _Handler(BaseHTTPRequestHandler):
    mode = "nospec"
    rng = random.Random(0)

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _reply(self, status: int, doc: Any) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _admit(self, fields: dict[str, Any]) -> str | None:
        if self.mode == "nospec" or self.mode == "dflash":
            return None
        if self.mode == "penaltyfault":
            fields = {**fields, "sampling_params": {
                k: v for k, v in (fields.get("sampling_params") or {}).items()
                if k not in PENALISED}}
        try:
            admission.check_request(fields)
        except admission.Refused as exc:
            return str(exc)
        return None

    def _late(self, why: str) -> None:
        """A refusal inside a started stream (the plugin on 0.5.17 before its HTTP admission)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"data: " + json.dumps({"error": {"message": why}}).encode()
                         + b"\n\ndata: [DONE]\n\n")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/completions":
            names = {v: k for k, v in request_params.V1_NAMES.items()}
            sp: dict[str, Any] = {"max_new_tokens": body.pop("max_tokens")}
            fields: dict[str, Any] = {"input_ids": body.pop("prompt")}
            for k, v in body.items():
                k = names.get(k, k)
                if k in admission.SAMPLING_RULES or k == "temperature":
                    sp[k] = v
                elif k in admission.REQUEST_RULES:
                    fields[k] = bool(v) if k == "return_logprob" else v
            why = self._admit({**fields, "sampling_params": sp})
            if why and body.get("stream") and self.mode == "latestream":
                return self._late(why)
            if why:
                return self._reply(400, {"object": "error", "message": why, "code": 400})
            ids = _tokens(self.mode, fields["input_ids"], sp, self.rng)
            return self._reply(200, {"choices": [{"text": "", "index": 0}], "n": len(ids)})
        why = self._admit({k: v for k, v in body.items()})
        if why and body.get("stream") and self.mode == "latestream":
            return self._late(why)
        if why:
            return self._reply(400, {"error": {"message": why}})
        sp = body.get("sampling_params") or {}
        ids = _tokens(self.mode, body["input_ids"], sp, self.rng)
        if int(sp.get("n", 1)) > 1 and not body.get("stream"):  # SGLang: one answer per copy
            return self._reply(200, [{"output_ids": _tokens(self.mode, body["input_ids"], sp,
                                                            self.rng), "meta_info": {}}
                                     for _ in range(int(sp["n"]))])
        if not body.get("stream"):
            return self._reply(200, {"output_ids": ids, "meta_info": {}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for i in range(1, len(ids) + 1):
                self.wfile.write(b"data: " + json.dumps({"output_ids": ids[:i]}).encode()
                                 + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:  # the client cut the stream: an abort
            pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the phase sends up to 40 requests at once
    daemon_threads = True


class _R:
    """What run_phase uses of rehearsal.run.Rehearsal."""

    def __init__(self, logs: Path) -> None:
        self.result: dict[str, Any] = {"checks": {}, "not_run": []}
        self.logs, self.running = logs, {}

    def healthy(self, name: str) -> bool:
        return True

    def left(self) -> float:
        return 500.0

    def save(self, logs: bool = True) -> None:
        pass


MODES = {"rp-nospec": "nospec", "rp-dflash": "dflash", "rp-ddtree15": "ddtree",
         "rp-ddtree31-nograph": "ddtree", "rp-ddtree15-topkfault": "topkfault",
         "rp-ddtree15-penaltyfault": "penaltyfault"}


@pytest.fixture()
def fakes(tmp_path: Path) -> Any:
    from dataclasses import replace

    started, servers = [], []
    for s in request_params.servers(str(tmp_path)):
        handler = type("H", (_Handler,), {"mode": MODES[s.name], "rng": random.Random(7)})
        httpd = _Server(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        servers.append(replace(s, port=httpd.server_address[1]))
        (tmp_path / f"{s.name}.log").write_text("[t] ready\n")
        (tmp_path / f"{s.name}.service").write_text(
            "Environment=SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1\n")
    yield servers
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def test_the_phase_passes_exact_servers_and_fails_both_negative_controls(
        fakes: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "transition_logits", lambda _path: LOGITS)
    monkeypatch.setattr(request_params.time, "sleep", lambda _s: None)
    r = _R(tmp_path)
    r.running = {s.name: type("Run", (), {"pid": os.getpid()})() for s in fakes}
    request_params.run_phase(r, fakes, tmp_path)
    got = r.result["checks"]
    verdict = got["request-params/verdict"]
    bad = {k: str(v)[:300] for k, v in got.items()
           if not v.get("ok") and "fault" not in k and "dflash" not in k}
    assert verdict["ok"], bad
    for name in ("rp-ddtree15", "rp-ddtree31-nograph"):
        for check in ("refusals", "greedy", "topk-mix", "penalty", "multiturn", "abort",
                      "parallel-n", "leaks"):
            assert got[f"request-params/{name}/{check}"]["ok"], (name, check)
    assert got["request-params/rp-ddtree15/topk-mix"]["top_k 2"]["transitions"] == 16 * 48
    # each control fails where its fault is, and only there among the token checks
    topk = got["request-params/rp-ddtree15-topkfault/topk-mix"]
    assert not topk["ok"] and topk["top_k 2"]["outside"] > 16 * 48 // 2
    assert topk["top_k 2"]["z"] < -10  # the statistic sees it too
    assert all(abs(got["request-params/rp-ddtree15/topk-mix"][k]["z"]) < 4
               for k in request_params.KINDS)
    assert topk["top_p 0.5"]["outside"] == 0 and topk["min_p 0.3"]["outside"] == 0
    assert got["request-params/rp-ddtree15-topkfault/refusals"]["ok"]
    pen = got["request-params/rp-ddtree15-penaltyfault/penalty"]
    assert not pen["ok"] and pen["served_wrong"] > 0 and pen["refused"] == 0
    assert not got["request-params/rp-ddtree15-penaltyfault/refusals"]["ok"]
    assert got["request-params/rp-nospec/topk-mix"]["ok"]
    # RESULTS.md's table from this result: every cell ran, the verdict reads PASS
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from request_params_table import table

    text = table(r.result, "dry run")
    assert "unrun" not in text and "verdict: PASS" in text
    assert "| topk-mix | pass" in text and "FAIL: 0 refused, 16 served wrong" in text
    assert table({}).count("unrun") == 8 * 6 + 1
    row = got["request-params/rp-ddtree15/refusals"]["rows"]["min_new_tokens"]
    assert {row[k]["status"] for k in ("generate", "generate-stream", "v1", "v1-stream")} == {400}
    assert row["neutral"]["status"] == 200


def test_a_leak_report_or_a_dead_server_fails_its_check(tmp_path: Path) -> None:
    log, unit = tmp_path / "s.log", tmp_path / "s.service"
    unit.write_text("Environment=SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1\n")
    log.write_text("[t] ok\n")
    assert request_params.leaks(log, unit, os.getpid())["ok"]
    log.write_text("ValueError: token_to_kv_pool_allocator memory leak detected! ...\n")
    assert not request_params.leaks(log, unit, os.getpid())["ok"]
    log.write_text("[t] ok\n")
    assert not request_params.leaks(log, unit, None)["ok"]
    unit.write_text("Environment=HF_HUB_OFFLINE=1\n")
    assert not request_params.leaks(log, unit, os.getpid())["ok"]


def test_the_h200_call_validates_and_says_what_it_found() -> None:
    """Device call 1 (2026-12-03, SGLang 0.5.11 on the H200, phases request-params,perf-8b),
    copied from the device's output to benchmarks/results/rehearsal/h200-issue25-call1.json."""
    from rehearsal import result

    got = result.load(str(ROOT / "benchmarks" / "results" / "rehearsal"
                          / "h200-issue25-call1.json"))
    assert got.phase == "request-params,perf-8b"
    checks = got.checks
    assert checks["request-params/verdict"]["ok"]  # type: ignore[call-overload]
    topk = checks["request-params/rp-ddtree15-topkfault/topk-mix"]
    assert topk["top_k 2"]["outside"] == 549  # type: ignore[call-overload]
    assert checks["request-params/rp-dflash/leaks"]["alive"] is False  # type: ignore[call-overload]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from request_params_table import table

    assert "verdict: PASS" in table(got.model_dump())


def _call(name: str) -> Any:
    from rehearsal import result

    return result.load(str(ROOT / "benchmarks" / "results" / "rehearsal" / name))


def test_session_7s_calls_validate_and_say_what_results_md_reports() -> None:
    """Session 7's device calls 2 (SGLang 0.5.17 + the plugin) and 3 (0.5.11 + the patch set),
    copied from the device's output (SYNTHETIC models): the numbers benchmarks/RESULTS.md quotes."""
    plugin = _call("h200-s7-call2-sglang0517-correctness-request-params.json")
    patch = _call("h200-s7-call3-sglang0511-request-params-perf8b.json")
    assert (plugin.sglang, patch.sglang) == ("0.5.17", "0.5.11")
    # 0.5.11: the phase passes; 0.5.17: it fails on the streamed refusals alone.
    assert patch.checks["request-params/verdict"]["ok"] is True  # type: ignore[call-overload]
    assert plugin.checks["request-params/verdict"]["ok"] is False  # type: ignore[call-overload]
    for server in ("rp-ddtree15", "rp-ddtree31-nograph"):
        rows = plugin.checks[f"request-params/{server}/refusals"]["rows"]  # type: ignore[call-overload]
        for row in rows.values():
            assert (row["generate"]["status"], row["v1"]["status"]) == (400, 400)
            assert row["generate-stream"]["status"] == 200 and row["generate-stream"]["named"]
        others = [k for k, v in plugin.checks.items()
                  if k.startswith(f"request-params/{server}/") and not k.endswith("/refusals")]
        assert others and all(plugin.checks[k]["ok"] for k in others), others  # type: ignore[call-overload]
    # The DFLASH anchor: top-k beside unfiltered rows and penalties served wrong on both.
    for got, z in ((patch, -23.9), (plugin, -24.6)):
        mix = got.checks["request-params/rp-dflash/topk-mix"]["top_k 2"]  # type: ignore[call-overload]
        assert round(mix["z"], 1) == z and mix["outside"] == 0
        pen = got.checks["request-params/rp-dflash/penalty"]  # type: ignore[call-overload]
        assert (pen["refused"], pen["served_wrong"]) == (0, 13)
    assert patch.checks["request-params/rp-dflash/leaks"]["alive"] is False  # type: ignore[call-overload]
    assert plugin.checks["request-params/rp-dflash/leaks"]["alive"] is True  # type: ignore[call-overload]
    # 0.5.17 correctness: accept lengths as predicted, the mask-fault control caught.
    for n, length in ((15, 3.81), (31, 4.71), (63, 5.56)):
        acc = plugin.checks[f"accept/ddtree{n}-ladder"]  # type: ignore[call-overload]
        assert acc["ok"] and round(acc["reported"]["spec_accept_length"], 2) == length
    assert plugin.checks["lossless/ddtree15-alarm-maskfault"]["wrong"] == 40  # type: ignore[call-overload]
    # Call 3's perf-8b (issue 28): DDTREE 15/8's bs 1 round and its host syncs a round.
    assert patch.perf8b is not None
    round_ms = patch.perf8b["timings"]["ddtree15-8b"]["batch1"]["round_ms_median"]
    assert round(round_ms, 2) == 8.70
    assert patch.perf8b["syncs"]["ddtree15-8b"] == {"syncs_per_round": 1.5, "limit": 2, "ok": True}


def test_session_8s_calls_validate_and_say_what_results_md_reports() -> None:
    """Session 8's device calls 1 (SGLang 0.5.17 + plugin 0.3.3, both verify switches on) and 2
    (0.5.11 + the patch set's correctness phase), copied from the device's output (SYNTHETIC
    models): the numbers benchmarks/RESULTS.md quotes."""
    plugin = _call("h200-s8-call1-sglang0517-plugin033-correctness-request-params.json")
    patch = _call("h200-s8-call2-sglang0511-correctness.json")
    assert (plugin.sglang, patch.sglang) == ("0.5.17", "0.5.11")
    assert plugin.checks["request-params/verdict"]["ok"] is True  # type: ignore[call-overload]
    # session 7's failing row: every streamed refusal is now a 400 naming DDTREE
    for server in ("rp-ddtree15", "rp-ddtree31-nograph"):
        rows = plugin.checks[f"request-params/{server}/refusals"]["rows"]  # type: ignore[call-overload]
        assert len(rows) == 8
        for row in rows.values():
            for route in ("generate", "generate-stream", "v1", "v1-stream"):
                assert (row[route]["status"], row[route]["named"]) == (400, True), route
            assert row["neutral"]["status"] == 200
    verify = plugin.checks["round-graphs/servers"]  # type: ignore[call-overload]
    on = "tree kernel on (SGLANG_DDTREE_TREE_ATTENTION=1); CUDA graphs with the tree's mask"
    for name in ("ddtree15-ladder", "ddtree63-ladder", "ddtree15-alarm", "rp-ddtree15"):
        assert verify[name]["target_verify"].startswith(on), name
    assert verify["ddtree31-ladder"]["target_verify"].startswith("tree kernel off")
    for got in (plugin, patch):
        for n, length in ((15, 3.81), (31, 4.71), (63, 5.56)):
            acc = got.checks[f"accept/ddtree{n}-ladder"]  # type: ignore[call-overload]
            assert acc["ok"] and round(acc["reported"]["spec_accept_length"], 2) == length
        lossless = {k: v for k, v in got.checks.items() if k.startswith("lossless/")}
        assert lossless.pop("lossless/ddtree15-alarm-maskfault")["wrong"] == 40  # type: ignore[index]
        assert len(lossless) >= 5 and all(v["wrong"] == 0 and v["ok"]  # type: ignore[index]
                                          for v in lossless.values())
    assert not patch.not_run and not patch.errors
    assert not patch.checks["sampling/ddtree15-ladder-hot"]["ok"]  # type: ignore[call-overload]
    assert patch.checks["sampling/ddtree15-ladder"]["ok"]  # type: ignore[call-overload]


def test_session_8s_calls_3_and_4_ran_the_landed_patch_set_and_plugin_default() -> None:
    """Session 8's calls 3 (0.5.11 + patch set 0.3.1) and 4 (0.5.17 + plugin 0.3.4, both verify
    paths on by default), SYNTHETIC designed models: what RESULTS.md and releases.py record."""
    patch = _call("h200-s8-call3-sglang0511-patchset031-correctness.json")
    plugin = _call("h200-s8-call4-sglang0517-plugin034-correctness.json")
    assert (patch.sglang, plugin.sglang) == ("0.5.11", "0.5.17")
    assert "payload 0.3.1" in patch.tool["payload_deploy"].stdout_tail
    assert "plugin 0.3.4" in plugin.tool["payload_deploy"].stdout_tail
    verify = plugin.checks["round-graphs/servers"]  # type: ignore[call-overload]
    for name in ("ddtree15-ladder", "ddtree15-alarm"):
        assert verify[name]["target_verify"].startswith("tree kernel on (default;"), name
    assert verify["ddtree31-ladder"]["target_verify"].startswith(
        "tree kernel off (SGLANG_DDTREE_TREE_ATTENTION=0)")
    for got in (patch, plugin):
        lossless = {k: v for k, v in got.checks.items() if k.startswith("lossless/")}
        assert lossless.pop("lossless/ddtree15-alarm-maskfault")["wrong"] == 40  # type: ignore[index]
        assert len(lossless) == 5 and all(v["ok"] and v["wrong"] == 0  # type: ignore[index]
                                          for v in lossless.values())
        for n, length in ((15, 3.81), (31, 4.71)):
            acc = got.checks[f"accept/ddtree{n}-ladder"]  # type: ignore[call-overload]
            assert acc["ok"] and round(acc["reported"]["spec_accept_length"], 2) == length
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_releases", ROOT / "payload" / "plugin" / "ddtree_sglang" / "releases.py")
    assert spec and spec.loader
    releases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(releases)
    assert {"0.3.3", "0.3.4"} <= set(releases.PLUGIN_GPU_PROVEN)


def test_a_streamed_refusal_inside_a_started_stream_fails_the_refusals_check() -> None:
    """Session 7's 0.5.17 finding: HTTP 200, then ``data: {"error": ...}`` naming DDTREE; the
    phase must flag it on both streamed routes and pass the same server's other routes."""
    handler = type("H", (_Handler,), {"mode": "latestream", "rng": random.Random(7)})
    httpd = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        got = request_params.refusals(httpd.server_address[1], ddtree=True)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert not got["ok"]
    for row in got["rows"].values():
        assert row["generate"]["status"] == row["v1"]["status"] == 400
        for route in ("generate-stream", "v1-stream"):
            assert row[route]["status"] == 200 and row[route]["named"], row[route]


class _CutStream(BaseHTTPRequestHandler):
    """A chunked answer that stops mid-chunk, as a server whose stream dies does."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"40\r\ndata: {\"error\"")
        self.wfile.flush()
        self.close_connection = True


def test_a_cut_stream_is_a_failed_answer_not_a_crash_of_the_phase() -> None:
    httpd = _Server(("127.0.0.1", 0), _CutStream)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        status, text = request_params.post(httpd.server_address[1], "/v1/completions", {})
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert status == -1 and text.startswith("IncompleteRead"), text
