"""A CPU dry run of the plugin bring-up's request half (rehearsal/plugin_smoke.py).

A started server's checks (``check_served``: 8 greedy requests on the ladder design, one sampled
request) run against a fake SGLang in a thread that answers /generate in token-id mode from the
ladder's closed form. Session 7's first device call crashed right there: the greedy result
(which carries its own ``ok``) was passed to ``Smoke.step`` as keywords next to its ``ok``
argument (``TypeError: Smoke.step() got multiple values for argument 'ok'``), and the DFLASH
half never ran.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rehearsal import plugin_smoke  # noqa: E402
from rehearsal.designs import expected, get_design  # noqa: E402

LAD = get_design("ladder")


class _Handler(BaseHTTPRequestHandler):
    skew = 0  # added to every greedy token: 0 is an exact server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        sp = body["sampling_params"]
        n = int(sp["max_new_tokens"])
        if float(sp.get("temperature", 1.0)) == 0.0:
            ids = [t + self.skew for t in expected(LAD, body["input_ids"], n)]
        else:
            ids = [10 + i % 7 for i in range(n)]
        data = json.dumps({"output_ids": ids, "meta_info": {}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _serve(skew: int) -> Iterator[int]:
    handler = type("H", (_Handler,), {"skew": skew})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture()
def exact() -> Iterator[int]:
    yield from _serve(0)


@pytest.fixture()
def wrong() -> Iterator[int]:
    yield from _serve(1)


ENV = {"SGLANG_DDTREE_BUDGET": "15", "SGLANG_DDTREE_TOPK": "8"}


def _steps(out: Path) -> list[dict[str, Any]]:
    return list(json.loads((out / "smoke.json").read_text())["steps"])


@pytest.mark.parametrize("algorithm", ["ddtree", "dflash", "none"])
def test_an_exact_server_passes_and_every_step_is_written(exact: int, tmp_path: Path,
                                                          algorithm: str) -> None:
    smoke = plugin_smoke.Smoke(tmp_path)
    assert plugin_smoke.check_served(smoke, algorithm, exact, ENV)
    steps = _steps(tmp_path)
    assert [(s["step"], s["ok"]) for s in steps] == [
        (f"{algorithm}: greedy lossless (8 requests, ladder design)", True),
        (f"{algorithm}: one sampled request", True)]
    greedy = steps[0]["info"]
    assert greedy["requests"] == 8 and greedy["wrong"] == 0 and greedy["ok"] is True
    assert "outputs" not in greedy
    assert steps[1]["info"]["tokens"] == 32


def test_a_wrong_server_fails_the_greedy_step(wrong: int, tmp_path: Path) -> None:
    smoke = plugin_smoke.Smoke(tmp_path)
    assert not plugin_smoke.check_served(smoke, "ddtree", wrong, ENV)
    greedy = _steps(tmp_path)[0]
    assert greedy["ok"] is False and greedy["info"]["wrong"] == 8


def test_a_steps_own_ok_is_never_replaced_by_what_it_found(tmp_path: Path) -> None:
    smoke = plugin_smoke.Smoke(tmp_path)
    assert not smoke.step("s", False, ok=True, step="other", seconds=1)
    assert _steps(tmp_path) == [{"step": "s", "ok": False,
                                 "info": {"ok": True, "step": "other", "seconds": 1}}]
