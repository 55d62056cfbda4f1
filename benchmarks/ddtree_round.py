"""Benchmark one DDTree round (build + compile + walk) against a per-node Python-heap version.

    python3 benchmarks/ddtree_round.py --out results.json            # CUDA, the issue's sizes
    python3 benchmarks/ddtree_round.py --device cpu --vocab 512 --budgets 15 --batches 1 2 \
        --rounds 5 --warmup 1                                        # quick CPU smoke run

For each (budget, batch): random draft logits ``[batch, D, vocab]`` on the device; one round is
``draft_topk`` + ``build_tree`` + ``compile_tree`` + ``walk_tree`` of ``payload/ddtree/core.py``.
Times are medians over ``--rounds`` rounds after ``--warmup`` rounds, measured with CUDA events
on CUDA (``time.perf_counter_ns`` on CPU). On CUDA the round is also timed replayed from a CUDA
graph, and run once under ``torch.cuda.set_sync_debug_mode("error")`` to prove it never
synchronises with the host. The Python-heap baseline below (the paper's algorithm popped one
node at a time on host lists, verify tensors copied back to the device) runs on the same inputs;
its trees, masks and walks must equal the core's exactly (``agree`` in the output).
"""

from __future__ import annotations

import argparse
import heapq
import json
import platform
import statistics
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# ------------------------------------------------------------------ the Python-heap baseline
# The paper's algorithm popped one node at a time, per request, on host lists; same tie rule as
# the core (score desc, depth asc, parent slot asc, rank asc) and float32 score arithmetic, so
# its trees equal the core's slot for slot.

NEG_INF = float("-inf")


def f32(x: float) -> float:
    """Round a Python float to float32 (a sum of two float32 values rounds exactly like torch's)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


@dataclass
class HeapTree:
    tokens: list[int]
    parents: list[int]
    depths: list[int]
    ranks: list[int]
    scores: list[float]
    valid: list[bool]


def heap_build(lp: list[list[float]], tok: list[list[int]], root: int, budget: int) -> HeapTree:
    """One request: ``lp``/``tok`` are ``[D][K]`` host lists sorted descending along K."""
    depths, k = len(lp), len(lp[0])
    t = HeapTree([root], [-1], [0], [0], [0.0], [True])
    heap: list[tuple[float, int, int, int, float]] = [(-lp[0][0], 1, 0, 0, f32(lp[0][0]))]
    while heap and len(t.tokens) <= budget:
        _, d, parent, rank, score = heapq.heappop(heap)
        if score == NEG_INF:
            break
        slot = len(t.tokens)
        t.tokens.append(tok[d - 1][rank])
        t.parents.append(parent)
        t.depths.append(d)
        t.ranks.append(rank)
        t.scores.append(score)
        t.valid.append(True)
        if rank + 1 < k:
            s = f32(t.scores[parent] + lp[d - 1][rank + 1])
            heapq.heappush(heap, (-s, d, parent, rank + 1, s))
        if d < depths:
            s = f32(score + lp[d][0])
            heapq.heappush(heap, (-s, d + 1, slot, 0, s))
    while len(t.tokens) <= budget:  # padding, same layout as the core
        t.tokens.append(-1)
        t.parents.append(0)
        t.depths.append(1)
        t.ranks.append(0)
        t.scores.append(NEG_INF)
        t.valid.append(False)
    return t


def heap_mask(t: HeapTree) -> list[list[bool]]:
    n = len(t.tokens)
    rows = []
    for i in range(n):
        row = [False] * n
        j = i
        while j >= 0:
            row[j] = True
            j = t.parents[j]
        rows.append(row)
    return rows


def heap_walk(t: HeapTree, target: list[int], depths: int) -> tuple[list[int], int, list[int]]:
    """-> (path padded to D + 1 with -1, bonus token, new tokens padded to D + 1 with -1)."""
    children: list[dict[int, int]] = [{} for _ in t.tokens]
    for slot in range(1, len(t.tokens)):
        if t.valid[slot]:
            children[t.parents[slot]][t.tokens[slot]] = slot
    path = [0]
    node = 0
    while target[node] in children[node]:
        node = children[node][target[node]]
        path.append(node)
    bonus = target[node]
    new = [t.tokens[s] for s in path[1:]] + [bonus]
    pad = depths + 1
    return path + [-1] * (pad - len(path)), bonus, new + [-1] * (pad - len(new))


def heap_round(
    top_lp: torch.Tensor,
    top_tok: torch.Tensor,
    roots: torch.Tensor,
    start: torch.Tensor,
    target_tokens: torch.Tensor,
    budget: int,
) -> dict[str, torch.Tensor]:
    """The whole round for a batch, results as device tensors (the layout of the core's)."""
    dev = top_lp.device
    lp_host = top_lp.float().cpu().tolist()
    tok_host = top_tok.cpu().tolist()
    roots_host = roots.cpu().tolist()
    start_host = start.cpu().tolist()
    trees = [
        heap_build(lp_host[b], tok_host[b], roots_host[b], budget) for b in range(len(roots_host))
    ]
    ids = [[x if x >= 0 else 0 for x in t.tokens] for t in trees]
    positions = [[start_host[b] + d for d in t.depths] for b, t in enumerate(trees)]
    masks = [heap_mask(t) for t in trees]
    out = {
        "input_ids": torch.tensor(ids, device=dev),
        "positions": torch.tensor(positions, device=dev),
        "mask": torch.tensor(masks, device=dev),
    }
    target_host = target_tokens.cpu().tolist()
    depths = top_lp.shape[1]
    walks = [heap_walk(t, target_host[b], depths) for b, t in enumerate(trees)]
    out["tokens"] = torch.tensor([t.tokens for t in trees], device=dev)
    out["parents"] = torch.tensor([t.parents for t in trees], device=dev)
    out["path"] = torch.tensor([w[0] for w in walks], device=dev)
    out["bonus"] = torch.tensor([w[1] for w in walks], device=dev)
    out["new_tokens"] = torch.tensor([w[2] for w in walks], device=dev)
    return out


# ---------------------------------------------------------------------------- benchmark driver

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "payload"))
from ddtree import build_tree, compile_tree, draft_topk, walk_tree  # noqa: E402
from ddtree.core import triton_available  # noqa: E402

Round = Callable[[], dict[str, torch.Tensor]]


def core_round(
    lp: torch.Tensor,
    tok: torch.Tensor,
    roots: torch.Tensor,
    start: torch.Tensor,
    target_tokens: torch.Tensor,
    budget: int,
    backend: str = "auto",
) -> dict[str, torch.Tensor]:
    """Build + compile + walk from the drafter's per-depth top-k."""
    tree = build_tree(lp, tok, roots, budget, backend=backend)
    verify = compile_tree(tree, start, backend=backend)
    walk = walk_tree(tree, target_tokens, verify.mask, backend=backend)
    return {
        "input_ids": verify.input_ids,
        "positions": verify.positions,
        "mask": verify.mask,
        "tokens": tree.tokens,
        "parents": tree.parents,
        "path": walk.path,
        "bonus": walk.bonus,
        "new_tokens": walk.new_tokens,
    }


def time_us(fn: Callable[[], object], device: torch.device, rounds: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    if device.type == "cuda":
        pairs = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) * 1000.0 for s, e in pairs]
    else:
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t0) / 1000.0)
    return statistics.median(samples)


def check_sync_free(fn: Round) -> tuple[bool, str]:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as exc:
        return False, str(exc).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return True, ""


def graph_time_us(fn: Round, rounds: int, warmup: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_us(graph.replay, torch.device("cuda"), rounds, warmup)


def bench_case(args: argparse.Namespace, device: torch.device, budget: int, batch: int) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(1234 + budget * 100 + batch)
    depths = args.block - 1
    logits = (torch.randn(batch, depths, args.vocab, generator=gen) * args.temperature).to(device)
    roots = torch.randint(0, args.vocab, (batch,), generator=gen).to(device)
    start = torch.randint(0, 4096, (batch,), generator=gen).to(device)
    # The target agrees with the drafter's top-1 at every depth, so the walk follows the tree.
    backend = args.backend
    lp, tok = draft_topk(logits, args.top_k, backend=backend)
    tree = build_tree(lp, tok, roots, budget, backend=backend)
    target = tok[:, :, 0].gather(1, tree.depths.clamp(max=depths - 1))

    # "round": from draft logits (the vocabulary top-k included); "tree": from the top-k.
    def core() -> dict[str, torch.Tensor]:
        top_lp, top_tok = draft_topk(logits, args.top_k, backend=backend)
        return core_round(top_lp, top_tok, roots, start, target, budget, backend)

    def torch_core() -> dict[str, torch.Tensor]:
        top_lp, top_tok = draft_topk(logits, args.top_k, backend="torch")
        return core_round(top_lp, top_tok, roots, start, target, budget, "torch")

    def heap() -> dict[str, torch.Tensor]:
        top_lp, top_tok = draft_topk(logits, args.top_k, backend=backend)
        return heap_round(top_lp, top_tok, roots, start, target, budget)

    def core_tree() -> dict[str, torch.Tensor]:
        return core_round(lp, tok, roots, start, target, budget, backend)

    def heap_tree() -> dict[str, torch.Tensor]:
        return heap_round(lp, tok, roots, start, target, budget)

    got, want = core(), heap()
    agree = all(torch.equal(got[key], want[key]) for key in want)
    fast = device.type == "cuda" and triton_available() and backend != "torch"
    row: dict = {"budget": budget, "batch": batch, "agree": agree}
    row["backend"] = "triton" if fast or backend == "triton" else "torch"
    if args.compare_torch:
        # The pure-torch path from the same top-k must build the very same trees and walks.
        slow = core_round(lp, tok, roots, start, target, budget, "torch")
        quick = core_tree()
        row["torch_agree"] = all(torch.equal(quick[key], slow[key]) for key in slow)
    row["mean_accepted"] = float((want["path"] >= 0).sum().item() - batch) / batch
    heap_warmup = min(args.warmup, 3)
    for name, c_fn, h_fn in (("", core, heap), ("tree_", core_tree, heap_tree)):
        row[f"{name}core_us"] = time_us(c_fn, device, args.rounds, args.warmup)
        row[f"{name}heap_us"] = time_us(h_fn, device, args.heap_rounds, heap_warmup)
        row[f"{name}speedup"] = row[f"{name}heap_us"] / row[f"{name}core_us"]
        if device.type == "cuda":
            row[f"{name}core_graph_us"] = graph_time_us(c_fn, args.rounds, args.warmup)
            row[f"{name}speedup_graph"] = row[f"{name}heap_us"] / row[f"{name}core_graph_us"]
    if args.compare_torch and device.type == "cuda":
        row["torch_graph_us"] = graph_time_us(torch_core, args.rounds, args.warmup)
    if device.type == "cuda":
        row["sync_free"], row["sync_error"] = check_sync_free(core)
    return row


def print_table(rows: list[dict]) -> None:
    cols = [
        "budget",
        "batch",
        "core_us",
        "core_graph_us",
        "heap_us",
        "speedup",
        "speedup_graph",
        "tree_core_us",
        "tree_core_graph_us",
        "tree_heap_us",
        "tree_speedup",
        "torch_graph_us",
        "backend",
        "agree",
        "torch_agree",
        "sync_free",
        "mean_accepted",
    ]
    cols = [c for c in cols if any(c in r for r in rows)]
    widths = [max(len(c), 8) for c in cols]
    print(" | ".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        cells = []
        for c, w in zip(cols, widths, strict=True):
            v = r.get(c, "")
            cells.append(f"{v:>{w}.1f}" if isinstance(v, float) else f"{v!s:>{w}}")
        print(" | ".join(cells))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    p.add_argument("--budgets", type=int, nargs="+", default=[15, 31, 63, 127])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--block", type=int, default=16, help="block size; depths = block - 1")
    p.add_argument("--temperature", type=float, default=3.0, help="scale of the random logits")
    p.add_argument("--rounds", type=int, default=500)
    p.add_argument("--heap-rounds", type=int, default=50)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument(
        "--backend", default="auto", choices=["auto", "torch", "triton"],
        help="the core's backend (auto: Triton kernels on CUDA where triton imports)",
    )  # fmt: skip
    p.add_argument(
        "--compare-torch", action="store_true",
        help="also time the pure-torch round (CUDA graph) and check it builds the same trees",
    )  # fmt: skip
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.block < 2 or args.top_k < 1 or args.vocab < 2 or min(args.budgets) < 1:
        p.error("need --block >= 2, --top-k >= 1, --vocab >= 2 and budgets >= 1")
    if min(args.batches) < 1 or args.rounds < 1 or args.heap_rounds < 1 or args.warmup < 0:
        p.error("need batches >= 1, rounds >= 1, heap rounds >= 1 and warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: CUDA is not available here; use --device cpu", file=sys.stderr)
        return 2
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        print(f"error: bad --device {args.device!r}: {exc}", file=sys.stderr)
        return 2
    rows = [bench_case(args, device, b, n) for n in args.batches for b in args.budgets]
    print_table(rows)
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": rows,
    }
    goal = [r for r in rows if r["budget"] == 63 and r["batch"] == 1]
    if goal:
        g, report["goal"] = goal[0], {}
        for name in ("", "tree_"):
            best = min(g[f"{name}core_us"], g.get(f"{name}core_graph_us", float("inf")))
            ratio = g[f"{name}heap_us"] / best
            report["goal"]["tree" if name else "round"] = {
                "best_us": best,
                "le_100us": best <= 100.0,
                "speedup": ratio,
                "speedup_ge_5x": ratio >= 5.0,
            }
            label = "round (with vocab top-k)" if not name else "tree (from top-k)"
            print(f"goal, budget 63 batch 1, {label}: {best:.1f} us, {ratio:.1f}x the heap")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    ok = all(r["agree"] and r.get("sync_free", True) and r.get("torch_agree", True) for r in rows)
    if not ok:
        print(
            "error: the core disagreed with the heap or synchronised with the host", file=sys.stderr
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
