"""Where a speculative round's time goes: SGLang's own torch profiler, summarised on the GPU host.

``capture`` asks a running server to profile its next ``steps`` forward steps
(``POST /start_profile`` with ``num_steps``: the scheduler stops and writes a Chrome trace by
itself), sends one greedy request long enough to cover them, and waits for the trace file.
``summarize`` reads that trace (gzip JSON, stdlib only) into a small dict that travels back in
the rehearsal's JSON instead of the multi-megabyte trace:

* ``window_ms`` and ``per_step_ms``: from the first to the last CPU operator, CUDA runtime call
  or GPU event of the trace (not Python frames: a long-lived frame is clipped to the profiler's
  start and stop, which would stretch the window of a trace with stacks);
* ``gpu``: kernel and copy counts and time, and the GPU's busy time as the union of its
  intervals, so ``idle_ms = window - busy`` is the time the GPU waited for the host;
* ``runtime``: the CUDA runtime and driver calls (launches, graph launches, copies, syncs) with
  count and host time; ``blocking_ms`` sums the synchronizes and synchronous copies only;
* ``host``: CPU operators and, with ``with_stack``, Python functions, by self time and by
  inclusive time, largest first. An operator's self time is its time outside nested operators
  of its thread (CUDA runtime calls it makes stay in it); a Python function's is its time
  outside its Python callees, by the trace's parent ids (see ``_self_times``).

Nothing here knows DDTREE from DFLASH: the comparison is between servers summarised alike.
"""

from __future__ import annotations

import gzip
import json
import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rehearsal import client

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
HOST_CATS = {"cpu_op", "python_function", "user_annotation"}
# Calls on which the host waits for the GPU: the synchronizes, and the synchronous copies by
# their exact names (cudaMemcpyAsync only enqueues; a pageable copy's wait shows as the
# cudaStreamSynchronize that follows it).
BLOCKING_EXACT = {"cudaMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpy"}


def _blocking(name: str) -> bool:
    return name.endswith("Synchronize") or name in BLOCKING_EXACT


# Runtime calls counted whole (``counts``): kernel launches (runtime and driver, Triton's
# cuLaunchKernel among them), graph launches, host synchronisations, copies.
COUNTED = {"launches": lambda n: "LaunchKernel" in n,
           "graph_launches": lambda n: "GraphLaunch" in n,
           "syncs": _blocking, "copies": lambda n: "Memcpy" in n}


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # "<built-in method sum of Tensor object at 0x..>"


def _name(event: Mapping[str, Any]) -> str:
    return _ADDRESS.sub("", str(event.get("name", "")))


def start_profile(port: int, out_dir: Path, steps: int, *, with_stack: bool,
                  timeout: float = 60.0) -> None:
    body = json.dumps({"output_dir": str(out_dir), "num_steps": steps,
                       "activities": ["CPU", "GPU"], "with_stack": with_stack,
                       "record_shapes": False}).encode()
    req = urllib.request.Request(f"http://{client.HOST}:{port}/start_profile", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # loopback only
        if resp.status != 200:
            raise RuntimeError(f"/start_profile answered {resp.status}")


def stop_profile(port: int, timeout: float = 60.0) -> None:
    req = urllib.request.Request(f"http://{client.HOST}:{port}/stop_profile", data=b"",
                                 method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # loopback only
        resp.read()


def wait_trace(out_dir: Path, deadline: float) -> tuple[Path, list[dict[str, Any]]]:
    """The trace file and its events once it reads whole (gzip and JSON), or TimeoutError."""
    while time.monotonic() < deadline:
        for path in sorted(out_dir.glob("*.trace.json.gz")):
            try:
                return path, load(path)
            except (OSError, EOFError, ValueError):  # still being written
                pass
        time.sleep(0.5)
    raise TimeoutError(f"no complete trace in {out_dir}")


def capture(port: int, out_dir: Path, *, steps: int = 24, tokens: int = 160,
            with_stack: bool = False, prompt: Iterable[int] = (11, 12, 100),
            timeout: float = 120.0) -> dict[str, Any]:
    """Profile ``steps`` forward steps of one greedy request; returns the trace's summary.

    A request that fails, or ends in fewer forward steps than asked (prefill + verifies), stops
    the profiler itself (else it would stay on into whatever runs next); the summary then
    divides by the steps that ran."""
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    start_profile(port, out_dir, steps, with_stack=with_stack)
    ans = client.generate(port, list(prompt), tokens, timeout=max(5.0, deadline - time.monotonic()))
    ran = 1 + int(ans.meta.get("spec_verify_ct") or len(ans.output_ids))
    if ans.error is not None or ran < steps:
        stop_profile(port)
    if ans.error is not None:
        raise RuntimeError(f"the profiled request failed: {ans.error}")
    trace, events = wait_trace(out_dir, deadline)
    summary = summarize(events, steps=min(steps, ran))
    summary["trace_file"] = trace.name
    summary["trace_bytes"] = trace.stat().st_size
    summary["request"] = {"tokens": len(ans.output_ids), "error": ans.error,
                          "spec_verify_ct": ans.meta.get("spec_verify_ct"),
                          "spec_accept_length": ans.meta.get("spec_accept_length")}
    return summary


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict)]


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals (microseconds in, ms out)."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total / 1000.0


def _self_times(events: list[dict[str, Any]]) -> dict[tuple[str, str], list[float]]:
    """(category, name) -> [count, inclusive us, self us].

    Python functions nest by the trace's own ``Python id``/``Python parent id`` (their time
    stamps cannot be trusted to nest: frames of several Python threads share one tid, and a
    long-lived frame is clipped to the profiler's start and stop); a function's self time is
    its duration less its Python children's. CPU operators nest by time within their thread,
    each child counted only for the part inside its parent, so a self time is never negative.
    """
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    py = [e for e in events if e.get("cat") == "python_function"]
    _python_tree(py, out)
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("cat") != "python_function":
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for items in by_thread.values():
        _nest(sorted(items, key=lambda e: (float(e["ts"]), -float(e["dur"]))), out)
    return out


def _python_tree(items: list[dict[str, Any]], out: dict[tuple[str, str], list[float]]) -> None:
    child: dict[Any, float] = defaultdict(float)
    for e in items:
        parent = (e.get("args") or {}).get("Python parent id")
        if parent is not None:
            child[(e.get("pid"), parent)] += float(e["dur"])
    for e in items:
        dur = float(e["dur"])
        own = (e.get("args") or {}).get("Python id")
        rec = out[("python_function", _name(e))]
        rec[0] += 1
        rec[1] += dur
        rec[2] += max(0.0, dur - child.get((e.get("pid"), own), 0.0)) if own is not None else dur


def _nest(items: list[dict[str, Any]], out: dict[tuple[str, str], list[float]]) -> None:
    """One thread's events, sorted by start (outer first): add each one's self time to ``out``.

    An event's parent is the innermost open event that contains it whole; one that only
    overlaps an open event (starts inside it, ends after it) is not that event's child."""
    open_: list[tuple[float, dict[str, Any]]] = []  # (end, event), in the order they opened
    child: dict[int, float] = defaultdict(float)  # id(event) -> time in its children

    def finish(done: dict[str, Any]) -> None:
        dur = float(done["dur"])
        rec = out[(str(done.get("cat")), _name(done))]
        rec[0] += 1
        rec[1] += dur
        rec[2] += max(0.0, dur - child.pop(id(done), 0.0))

    for e in items:
        ts, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        for item in [o for o in open_ if o[0] <= ts]:
            open_.remove(item)
            finish(item[1])
        parent = next((ev for o_end, ev in reversed(open_) if o_end >= end), None)
        if parent is not None:
            child[id(parent)] += float(e["dur"])
        open_.append((end, e))
    for _, ev in open_:
        finish(ev)


def _top(table: Mapping[tuple[str, str], list[float]], cats: set[str], key: int,
         n: int) -> list[dict[str, Any]]:
    rows = sorted(((k, v) for k, v in table.items() if k[0] in cats),
                  key=lambda kv: -kv[1][key])[:n]
    return [{"name": name[:160], "count": int(c), "incl_ms": round(i / 1000, 3),
             "self_ms": round(s / 1000, 3)} for (_, name), (c, i, s) in rows]


def summarize(events: list[dict[str, Any]], *, steps: int, top: int = 40) -> dict[str, Any]:
    """The summary described in the module docstring; ``steps`` divides the window."""
    spans = [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]
    gpu = [e for e in spans if e.get("cat") in GPU_CATS]
    runtime = [e for e in spans if e.get("cat") in RUNTIME_CATS]
    host = [e for e in spans if e.get("cat") in HOST_CATS]
    timed = gpu + runtime + [e for e in host if e.get("cat") != "python_function"] or host
    if not timed:
        return {"steps": steps, "window_ms": 0.0, "per_step_ms": None, "gpu": {}, "runtime": [],
                "host": {}, "events": len(events)}
    lo = min(float(e["ts"]) for e in timed)
    hi = max(float(e["ts"]) + float(e["dur"]) for e in timed)
    window = (hi - lo) / 1000.0
    busy = _union_ms([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu])
    kernels = [e for e in gpu if e.get("cat") == "kernel"]
    calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in runtime:
        calls[_name(e)][0] += 1
        calls[_name(e)][1] += float(e["dur"])
    blocking = sum(t for name, (_, t) in calls.items() if _blocking(name))
    counts = {kind: sum(int(c) for name, (c, _) in calls.items() if test(name))
              for kind, test in COUNTED.items()}
    kernel_names: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        kernel_names[_name(e)][0] += 1
        kernel_names[_name(e)][1] += float(e["dur"])
    per = max(1, steps)
    table = _self_times(host)
    py, ops = {"python_function"}, {"cpu_op", "user_annotation"}
    return {
        "steps": steps,
        "events": len(events),
        "window_ms": round(window, 3),
        "per_step_ms": round(window / per, 3),
        "gpu": {
            "busy_ms": round(busy, 3), "idle_ms": round(window - busy, 3),
            "busy_per_step_ms": round(busy / per, 3),
            "kernels": len(kernels), "kernels_per_step": round(len(kernels) / per, 1),
            "kernel_ms": round(sum(float(e["dur"]) for e in kernels) / 1000, 3),
            "copies": sum(1 for e in gpu if e.get("cat") != "kernel"),
            "top_kernels": [{"name": n[:120], "count": int(c), "ms": round(t / 1000, 3)}
                            for n, (c, t) in sorted(kernel_names.items(),
                                                    key=lambda kv: -kv[1][1])[:15]],
        },
        "runtime": [{"name": n, "count": int(c), "ms": round(t / 1000, 3),
                     "per_step": round(c / per, 1)}
                    for n, (c, t) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:20]],
        "blocking_ms": round(blocking / 1000, 3),
        "counts": counts,
        "blocking_per_step_ms": round(blocking / 1000 / per, 3),
        "host": {
            "ops_by_self": _top(table, ops, 2, top),
            "python_by_self": _top(table, py, 2, top),
            "python_by_incl": _top(table, py, 1, top),
            # SGLang's and the payload's own functions (the scheduler's loop, the workers,
            # the verify inputs, the graph runner), by inclusive time: the round's outline.
            "sglang_by_incl": _top({k: v for k, v in table.items() if "sglang/" in k[1]},
                                   py, 1, 2 * top),
        },
    }
