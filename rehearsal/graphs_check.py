"""On the GPU host: the deployed payload's round graphs against its eager round, on real CUDA.

    python -m rehearsal.graphs_check          # prints one JSON object

Run with the serving venv's python after ``payload deploy`` (it imports the payload's modules
from the patched sglang package, as the server does). For each size (vocabulary, hidden width,
budget, top-k, shadow-linear) and batch size, the deployed ``DDTreeWorker``'s own ``_plan`` (the
drafter's head, the vocabulary top-k in row chunks, build, compile, the mask's placement) and
``_finish`` (the walk) run eagerly and from the worker's own graph caches (``_round_graphs``) on
the same random inputs, round after round; every output must be equal. It also times both:
host microseconds per call (the Python and launch cost the graph removes) and GPU microseconds
per call (CUDA events). It runs while the servers start, so its timings share the host.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import types
from typing import Any

SIZES = ((32000, 1024, 15, 8, False), (32000, 1024, 15, 8, True), (151936, 4096, 15, 8, False),
         (151936, 4096, 31, 32, False))  # vocabulary, hidden, budget, top-k, shadow-linear
BATCHES = (1, 8, 32)
DEPTHS = 15


def tensor_leaves(x: Any) -> list[Any]:
    """The tensors in ``x`` (tensors, tuples, lists and dataclasses of them), in order."""
    import dataclasses

    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in tensor_leaves(v)]
    if dataclasses.is_dataclass(x):
        return [t for f in dataclasses.fields(x) for t in tensor_leaves(getattr(x, f.name))]
    return []


def same_tensors(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` hold equal tensors in the same places."""
    import torch

    la, lb = tensor_leaves(a), tensor_leaves(b)
    return len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb, strict=True))


def _host_us(call: Any, reps: int = 30) -> float:
    import torch

    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)  # launch and Python only: no wait for the GPU
    torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


def _gpu_us(call: Any, reps: int = 30) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        start.record()
        call()
        end.record()
        end.synchronize()
        out.append(1000 * start.elapsed_time(end))
    return statistics.median(out)


def _worker(budget: int, k: int, shadow: bool) -> Any:
    """The deployed ``DDTreeWorker``'s round methods on an object holding what a round reads
    (no model, no process group: TP 1)."""
    import sglang.srt.speculative.ddtree_worker as mod

    mod.get_tp_group = lambda: types.SimpleNamespace(world_size=1)
    w = object.__new__(mod.DDTreeWorker)
    w.__dict__.update(ddtree_budget=budget, ddtree_topk=k, ddtree_shadow_linear=shadow,
                      ddtree_score_chain=shadow)
    w._plan_graphs, w._walk_graphs = w._round_graphs(types.SimpleNamespace(
        cuda_graph_max_bs=max(BATCHES), disable_cuda_graph=False, max_running_requests=None))
    return w


def _one_size(vocab: int, width: int, budget: int, k: int, shadow: bool,
              gen: Any) -> list[dict[str, Any]]:
    import torch
    from sglang.srt.speculative import ddtree_verify as v

    head = types.SimpleNamespace(
        weight=torch.randn(vocab, width, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.05,
        shard_indices=types.SimpleNamespace(num_added_elements=0, num_org_elements=vocab,
                                            org_vocab_start_index=0))
    w = _worker(budget, k, shadow)
    rows: list[dict[str, Any]] = []
    for bs in BATCHES:
        equal = True
        for _ in range(4):
            hidden = torch.randn(bs, DEPTHS, width, device="cuda", dtype=torch.bfloat16,
                                 generator=gen)
            roots = torch.randint(0, vocab, (bs,), device="cuda", generator=gen)
            starts = torch.randint(1, 3000, (bs,), device="cuda", generator=gen)
            (plan, index), (want, none) = (w._plan_graphs(bs, hidden, roots, starts, head),
                                           w._plan(hidden, roots, starts, head))
            equal &= same_tensors(plan, want) and none is None and index is not None
            equal &= bool(torch.equal(index, v.custom_mask_index(starts, want.width)))
            target = torch.randint(0, vocab, tuple(want.tree.tokens.shape), device="cuda",
                                   generator=gen)
            equal &= same_tensors(w._finish(plan, target), v.finish_and_pack(want, target))
        inputs = (hidden, roots, starts, head)

        def eager(inputs: Any = inputs, target: Any = target) -> None:
            v.finish_and_pack(w._plan(*inputs)[0], target)

        def graphed(inputs: Any = inputs, target: Any = target, bs: int = bs) -> None:
            w._finish(w._plan_graphs(bs, *inputs)[0], target)

        rows.append({"vocab": vocab, "hidden": width, "budget": budget, "topk": k,
                     "shadow_linear": shadow, "bs": bs, "equal": bool(equal),
                     "host_us_eager": round(_host_us(eager), 1),
                     "host_us_graph": round(_host_us(graphed), 1),
                     "gpu_us_eager": round(_gpu_us(eager), 1),
                     "gpu_us_graph": round(_gpu_us(graphed), 1)})
    rows[-1]["failed"] = w._plan_graphs.failed or w._walk_graphs.failed
    rows[-1]["counts"] = {"plan": dict(w._plan_graphs.counts),
                          "walk": dict(w._walk_graphs.counts)}
    return rows


def check() -> dict[str, Any]:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(3)
    rows: list[dict[str, Any]] = []
    for size in SIZES:
        rows += _one_size(*size, gen)
        torch.cuda.empty_cache()
    counted = [r["counts"] for r in rows if "counts" in r]
    captured = all(c[w]["captured"] == len(BATCHES) for c in counted for w in ("plan", "walk"))
    return {"ok": captured and all(r["equal"] for r in rows)
            and not any(r.get("failed") for r in rows),
            "device": torch.cuda.get_device_name(), "rows": rows}


def main() -> int:
    try:
        out = check()
    except Exception as exc:  # reported in the rehearsal's JSON, not as a traceback only
        import traceback

        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
               "trace": traceback.format_exc()[-3000:]}
    print(json.dumps(out))
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
