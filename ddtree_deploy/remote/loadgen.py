"""The bench's load generator, run ON the host (standard library only, sent on stdin).

Why not SGLang's own `python -m sglang.bench_serving` (it ships in the served venv)? In 0.5.11
its sglang backend counts tokens and times chunks from the streamed `text` only: a server
started with `--skip-tokenizer-init` streams `output_ids` and no text, so bench_serving records
no first token and no inter-token latency there; it needs a Hugging Face tokenizer for every
dataset (the test models have none); its sampling parameters are fixed to temperature 0 unless
the whole `sampling_params` is replaced; and its accept length is one server-wide average from
/server_info, not per workload and request. This script measures what bench needs from the same
/generate stream: per request the time to the first token, the arrival of every chunk with its
cumulative token count, the final `meta_info` (spec_accept_length, spec_verify_ct), failures.

Load is bounded in count (the sessions given) and in time (no new request after the time
limit; each request has a socket timeout) and goes only to the service's own loopback address.
The plan comes as PLAN (a JSON text put in front of this source by the workstation, which is
why there is no `from __future__` import: Python 3.9+ evaluates these annotations as they are);
one JSON object is printed.
"""

import http.client
import json
import sys
import threading
import time
from typing import Any

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _request(plan: dict[str, Any], prompt: Any) -> tuple[dict[str, Any], list[int], str]:
    key = "input_ids" if plan["ids"] else "text"
    params = dict(plan["params"])
    params.update(max_new_tokens=plan["max_new_tokens"], ignore_eos=True)
    body = json.dumps({key: prompt, "stream": True, "sampling_params": params})
    out: dict[str, Any] = {"ok": False, "status": None, "ttft": None, "e2e": None, "tokens": 0,
           "arrivals": [], "meta": {}, "error": None}
    ids: list[int] = []
    text = ""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(plan["addr"], plan["port"],
                                      timeout=plan["request_timeout_s"])
    try:
        conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["status"] = resp.status
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: " + resp.read(2000).decode("utf-8", "replace")
            return out, ids, text
        last = 0
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                out["error"] = str(chunk["error"])[:2000]
                return out, ids, text
            meta = chunk.get("meta_info") or {}
            ids = chunk.get("output_ids") or ids
            text = chunk.get("text") if isinstance(chunk.get("text"), str) else text
            n = meta.get("completion_tokens")
            n = n if isinstance(n, int) else len(ids)
            if n > last:
                now = time.perf_counter() - t0
                if out["ttft"] is None:
                    out["ttft"] = now
                out["arrivals"].append([round(now, 6), n])
                last = n
            if meta.get("finish_reason") is not None:
                out["meta"] = {k: meta.get(k) for k in (
                    "completion_tokens", "prompt_tokens", "spec_accept_length",
                    "spec_verify_ct", "e2e_latency", "finish_reason")}
        out["tokens"] = last
        out["ok"] = last > 0 and bool(out["meta"])
        if not out["ok"]:
            out["error"] = "the stream ended without a finished answer"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        out["e2e"] = time.perf_counter() - t0
        conn.close()
    return out, ids, text


def run(plan: dict[str, Any]) -> dict[str, Any]:
    if plan["addr"] not in LOOPBACK:
        return {"error": f"refusing to send load to {plan['addr']}: only the service's own "
                         "loopback address"}
    deadline = time.monotonic() + plan["time_limit_s"]
    jobs = list(enumerate(plan["sessions"]))
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    stopped = {"by_time": False}

    def session(index: int, sess: dict[str, Any]) -> None:
        prompt, tools = sess["prompt"], sess["tools"]
        for turn in range(1 + len(tools)):
            res, ids, text = _request(plan, prompt)
            res.update(session=index, turn=turn, prompt_len=len(prompt))
            with lock:
                results.append(res)
            if not res["ok"] or turn == len(tools):
                return
            if time.monotonic() >= deadline:
                stopped["by_time"] = True
                return
            if plan["ids"]:
                prompt = list(prompt) + list(ids) + list(tools[turn])
            else:
                prompt = f"{prompt}{text}\n{tools[turn]}\n"

    def worker() -> None:
        while True:
            with lock:
                if not jobs:
                    return
                if time.monotonic() >= deadline:
                    stopped["by_time"] = True
                    return
                index, sess = jobs.pop(0)
            session(index, sess)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(max(1, min(plan["concurrency"], len(jobs))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall_s": time.perf_counter() - t0, "requests": results,
            "not_sent": len(jobs), "stopped_by_time": stopped["by_time"]}


def main() -> None:
    plan = json.loads(globals()["PLAN"])  # put in front of this source by the workstation
    sys.stdout.write(json.dumps(run(plan)) + "\n")


if __name__ == "__main__":
    main()
