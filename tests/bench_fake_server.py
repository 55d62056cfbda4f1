"""`python -m sglang.launch_server` for bench tests on this machine (no lab, no GPU).

A fake venv's bin/python runs this file; it reads the flags a rendered unit passes, and serves
the lab stand-in's endpoints (lab/ddtree_lab/standin_server: token-id mode, SSE streaming,
meta_info) with its SYNTHETIC speed model for those flags. Start-up lines as SGLang prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab" / "ddtree_lab" /
                       "standin_server"))

from ddtree_lab_standin import http as labhttp
from ddtree_lab_standin import serving
from ddtree_lab_standin.speedmodel import SpeedModel


def main(argv: list[str]) -> int:
    if argv[:2] == ["-m", "sglang.launch_server"]:
        argv = argv[2:]
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-draft-model-path", default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-ddtree-budget", type=int, default=0)
    p.add_argument("--speculative-ddtree-topk", type=int, default=1)
    p.add_argument("--speculative-ddtree-shadow-linear", action="store_true")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    ns, _rest = p.parse_known_args(argv)
    fail = os.environ.get("BENCH_FAKE_FAIL", "")
    algorithm = (ns.speculative_algorithm or "NONE").upper()
    if fail and fail == algorithm:
        print("ValueError: DDTREE full-tree verification needs the triton attention backend, "
              "got attention_backend=fa3. Use --attention-backend triton.", flush=True)
        return 1
    conf = json.loads((Path(ns.model_path) / "config.json").read_text())
    block = 16
    if ns.speculative_draft_model_path:
        draft = json.loads((Path(ns.speculative_draft_model_path) / "config.json").read_text())
        block = int(draft.get("block_size") or block)
    speed = SpeedModel(algorithm=algorithm, block=block, budget=ns.speculative_ddtree_budget,
                       topk=ns.speculative_ddtree_topk,
                       shadow_linear=ns.speculative_ddtree_shadow_linear)
    state = serving.ServerState(
        args={"skip_tokenizer_init": ns.skip_tokenizer_init,
              "speculative_algorithm": None if algorithm == "NONE" else algorithm},
        version="0.5.11", model_path=ns.model_path, served_model_name=ns.model_path,
        model_type="qwen3", architectures=["Qwen3ForCausalLM"], algorithm=algorithm,
        context_length=4096, skip_tokenizer_init=ns.skip_tokenizer_init,
        vocab_size=int(conf.get("vocab_size") or 1024), speed=speed, warmup_s=0.3)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = labhttp.make_server(ns.host, ns.port, serving.routes(state), timestamps=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"{labhttp.stamp()}INFO:     Uvicorn running on http://{ns.host}:{ns.port} "
          "(Press CTRL+C to quit)", flush=True)
    state.started = time.monotonic()
    while not stop.wait(0.1):
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
