"""Bring-up of the plugin form on the GPU host: SGLang 0.5.17 + the DDTree plugin, one device call.

    python3 -m rehearsal.plugin_smoke --carry .carry-0.5.17 --out $OUT [--algorithms ddtree,dflash]

Installs the 0.5.17 carry set into this Python's venv, builds the plugin wheel from the checkout
(payload/plugin/build.py) and installs it (pip, no index, no deps), runs the plugin's own check
(``python -I -m ddtree_sglang.check --full``), writes the ladder design's models, then per
algorithm starts ``python -m sglang.launch_server`` by hand (the argv and environment the README
gives for the plugin form), waits for /health, sends greedy requests whose answers are known in
closed form (``rehearsal/designs.py``) and one sampled request, stops the server and keeps its log.
Writes OUT/smoke.json after every step and OUT/server-<algorithm>.log; prints each log's tail.
Exit 0 when every step passed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rehearsal import checks, client
from rehearsal.designs import get_design
from rehearsal.models import write_design

REPO = Path(__file__).resolve().parent.parent
SERVER_ENV = {
    "HF_HUB_OFFLINE": "1", "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1", "PYTHONUNBUFFERED": "1",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
}


class Smoke:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.result: dict[str, Any] = {"steps": []}

    def step(self, name: str, ok: bool, /, **info: Any) -> bool:
        """Record one step (``info``: what it found; its own ``step``/``ok`` keys, where a check's
        result carries them, are kept under ``info`` and never replace the step's)."""
        self.result["steps"].append({"step": name, "ok": ok, "info": info})
        (self.out / "smoke.json").write_text(json.dumps(self.result, indent=2) + "\n")
        print(f"[{'ok' if ok else 'FAIL'}] {name} {json.dumps(info)[:600]}", flush=True)
        return ok


def run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def server_argv(algorithm: str, models: Path, port: int, block: int, context: int) -> list[str]:
    """The plugin form's argv (README: "The plugin form by hand")."""
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(models / "target"),
            "--port", str(port), "--host", "127.0.0.1", "--skip-tokenizer-init",
            "--dtype", "bfloat16", "--context-length", str(context), "--page-size", "1",
            "--attention-backend", "triton", "--sampling-backend", "pytorch",
            "--grammar-backend", "none", "--mem-fraction-static", "0.5",
            "--max-total-tokens", "65536", "--max-running-requests", "32",
            "--cuda-graph-max-bs", "32", "--random-seed", "1234", "--disable-overlap-schedule"]
    if algorithm != "none":
        argv += ["--speculative-algorithm", algorithm.upper(),
                 "--speculative-draft-model-path", str(models / "draft"),
                 "--speculative-num-draft-tokens", str(block)]
    return argv


def wait_health(port: int, proc: subprocess.Popen, deadline: float) -> str | None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            return f"server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(2)
    return f"no /health within {deadline:.0f} s"


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def check_served(smoke: Smoke, algorithm: str, port: int, env: dict[str, str]) -> bool:
    """The requests a started server answers: 8 greedy ones on the ladder design (closed form)
    and one sampled; True when the greedy answers are exact and the sampled one complete."""
    design = get_design("ladder")
    prompts = checks.prompt_set(design, 8, seed=1, max_len=120, max_out=64)
    res = checks.lossless(port, design, prompts, concurrency=8,
                          algorithm=None if algorithm == "none" else algorithm.upper(),
                          budget=int(env.get("SGLANG_DDTREE_BUDGET", "15")),
                          topk=int(env.get("SGLANG_DDTREE_TOPK", "8")))
    greedy = not res.get("wrong") and not res.get("failed")
    smoke.step(f"{algorithm}: greedy lossless (8 requests, ladder design)", greedy,
               **{k: v for k, v in res.items() if k != "outputs"})
    sampled = client.generate(port, prompts[0][0], 32,
                              sampling={"temperature": 0.7, "top_p": 0.9, "top_k": 20})
    whole = smoke.step(f"{algorithm}: one sampled request", sampled.error is None
                       and len(sampled.output_ids) == 32, error=sampled.error,
                       tokens=len(sampled.output_ids), seconds=round(sampled.seconds, 1))
    return greedy and whole


def serve_and_check(smoke: Smoke, algorithm: str, models: Path, port: int,
                    env: dict[str, str], deadline: float) -> bool:
    design = get_design("ladder")
    log = smoke.out / f"server-{algorithm}.log"
    argv = server_argv(algorithm, models, port, design.block_size, design.context_length)
    t0 = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        why = wait_health(port, proc, deadline)
        if not smoke.step(f"{algorithm}: start", why is None, seconds=round(time.monotonic() - t0),
                          argv=argv[1:], error=why):
            return False
        return check_served(smoke, algorithm, port, env)
    finally:
        stop(proc)
        text = log.read_text(errors="replace").splitlines()
        print(f"--- {log.name} (last 25 lines) ---\n" + "\n".join(text[-25:]), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rehearsal.plugin_smoke")
    ap.add_argument("--carry", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--algorithms", default="ddtree")
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds for a server start")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    smoke = Smoke(args.out)
    work = Path(tempfile.gettempdir()) / "ddtree-plugin-smoke"
    (work / "home").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **SERVER_ENV, "HOME": str(work / "home"),
           "SGLANG_DDTREE_BUDGET": "15", "SGLANG_DDTREE_TOPK": "8"}
    t0 = time.monotonic()
    rc, text = run([sys.executable, "-m", "rehearsal.carry", "install", str(args.carry),
                    "--target", sys.prefix], 400)
    if not smoke.step("carry install", rc == 0, seconds=round(time.monotonic() - t0),
                      tail=text[-800:]):
        return 1
    rc, text = run([sys.executable, str(REPO / "payload" / "plugin" / "build.py"),
                    "--out", str(work / "plugin")], 60)
    wheel = json.loads(text.strip().splitlines()[-1])["wheel"] if rc == 0 else ""
    rc2, text2 = run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                      "--force-reinstall", "--disable-pip-version-check", wheel], 120) \
        if rc == 0 else (1, "")
    if not smoke.step("plugin build + install", rc == 0 and rc2 == 0, wheel=wheel,
                      tail=(text + text2)[-600:]):
        return 1
    rc, text = run([sys.executable, "-I", "-m", "ddtree_sglang.check", "--full"], 300, env)
    if not smoke.step("ddtree_sglang.check --full", rc == 0, answer=text[-1500:]):
        return 1
    models = work / "ladder"
    write_design(models, get_design("ladder"))
    passed = True
    for i, algorithm in enumerate(a.strip() for a in args.algorithms.split(",") if a.strip()):
        ok = serve_and_check(smoke, algorithm, models, 31500 + i, env, args.deadline)
        passed = ok and passed
    smoke.result["passed"] = passed
    smoke.step("done", passed, seconds=round(time.monotonic() - t0))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
