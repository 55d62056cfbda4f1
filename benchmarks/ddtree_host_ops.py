"""Count the host-side work of one DDTREE round and of one DFLASH round in SGLang 0.5.11, on CPU.

    .venv/bin/python benchmarks/ddtree_host_ops.py                  # the table (markdown)
    .venv/bin/python benchmarks/ddtree_host_ops.py --json out.json  # and the raw counts

Both paths run as they do in SGLang, from the drafter's hidden states to the verified tokens:
the tail of ``DFlashWorker._prepare_for_speculative_decoding`` after the draft forward (compiled
from the patched 0.5.11 ``dflash_worker.py``: DFLASH's greedy head and ``DFlashVerifyInput``, or
the payload's hook into ``DDTreeWorker.ddtree_prepare_verify``: ``_draft_topk``, ``plan_round``,
``DDTreeVerifyInput.from_round`` and ``prepare_for_verify`` with the custom mask), then a fake
target forward (not counted), then ``verify`` (the target's tokens, accept/walk, the KV
bookkeeping). SGLang's GPU-only modules are small fakes (as in tests/test_payload_integration.py's
``verify_mods``): the allocator does what 0.5.11's page-size-1 allocator does (two slices to
allocate, one ``cat`` to free); the req->token writer is one Triton launch.

Counted per round, under a ``TorchDispatchMode`` (ATen ops) and a ``TorchFunctionMode`` (which
tensors live on the GPU in SGLang: the batch's device tensors, what is computed from them, and
factories given a ``device=``; ``seq_lens_cpu`` and what ``.cpu()`` returns are host tensors):
* ``kernels``: ATen ops on device tensors that launch work on CUDA (views and bare allocations
  excluded), plus the Triton launches (the payload's core and SGLang's req->token writer);
* ``views/allocs``: device-side ATen ops that launch nothing (metadata, ``empty``);
* ``host ops``: ATen ops on host tensors (the per-request loops over ``packed``, ...);
* ``syncs``: device->host reads: ``.cpu()``/``.tolist()``/``.item()``/``int()``/``bool()`` of a
  device tensor, and ops whose output size depends on device data (boolean-mask indexing,
  ``nonzero``, ``masked_select``);
* ``H2D``: host->device copies (``torch.tensor(list, device=...)``, ``.to(device)`` of a host
  tensor); one that is not ``non_blocking`` counts as a sync too (torch waits for the stream
  after a blocking copy);
* ``prefix-sized``: elements of the device tensors whose size grows with the prefix (found by
  running the round at two prefix lengths and comparing each op's output size).

On CUDA the payload's core (``draft_topk``, ``build_tree``, ``compile_tree``, ``walk_tree``) runs
as Triton kernels (payload/ddtree/triton_kernels.py): each is counted as its launches (2, 1, 1, 1)
and the ``torch.empty`` allocations of its wrapper, not as its CPU torch path. Time: the fastest
of ``--rounds`` rounds of each path's wall time with no mode active (the core's CPU path
excluded), at a tiny vocabulary and hidden size in float32 on one thread (so that the CPU's
arithmetic is negligible and what is left is Python and dispatch): a proxy for host work, noisy
on a shared machine, and not a GPU measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from host_ops_counter import TRITON_CORE, Counts, Session
from host_ops_sglang import (
    PAYLOAD,
    WHEEL,
    Alloc,
    TritonAttnBackend,
    find_wheel,
    load,
    patched_package,
)

# What other benchmarks and the tests take from here (ddtree_round_syncs.py: ``ops.*``).
__all__ = ["PAYLOAD", "TRITON_CORE", "WHEEL", "Counts", "Session", "Sizes", "find_wheel", "load",
           "main", "make_inputs", "patched_package", "run_round"]


@dataclasses.dataclass(frozen=True)
class Sizes:
    bs: int
    vocab: int = 32000
    hidden: int = 1024
    block: int = 16
    budget: int = 15
    topk: int = 8
    prefix: int = 256
    dtype: torch.dtype = torch.bfloat16


class _Req:
    def __init__(self, prompt: list[int], root: int) -> None:
        self.origin_input_ids, self.output_ids = prompt, [root]
        self.grammar, self.spec_verify_ct, self.spec_accepted_drafts = None, 0, 0
        self.kv_committed_len = self.kv_allocated_len = len(prompt)
        self.require_reasoning = False

    def check_finished(self) -> None:
        pass

    def finished(self) -> bool:
        return False


class _Greedy:
    is_all_greedy, has_custom_logit_processor, logit_bias = True, False, None
    penalizer_orchestrator = types.SimpleNamespace(is_required=False)

    def __init__(self, bs: int) -> None:
        self.bs = bs

    def __len__(self) -> int:
        return self.bs


@dataclasses.dataclass
class Inputs:
    batch: Any
    hidden: torch.Tensor  # the drafter's output hidden states [bs * block, H]
    block_ids: torch.Tensor
    positions_2d: torch.Tensor
    lm_head: Any
    target_logits: torch.Tensor  # [bs * N, V]: the fake target's answer
    target_hidden: torch.Tensor


def make_inputs(s: Sizes, seed: int, weight: torch.Tensor) -> Inputs:
    gen = torch.Generator().manual_seed(seed)
    bs, n = s.bs, s.budget + 1
    lens = torch.full((bs,), s.prefix, dtype=torch.int64)
    alloc = Alloc(bs * (s.prefix + 4 * n) + 64)
    req_to_token = torch.zeros(bs, s.prefix + 4 * n, dtype=torch.int32)
    for b in range(bs):
        req_to_token[b, : s.prefix] = alloc.alloc(s.prefix).to(torch.int32)
    roots = torch.randint(0, s.vocab, (bs,), generator=gen)
    batch = types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(is_idle=lambda: False), device="cpu",
        reqs=[_Req(list(range(s.prefix)), int(r)) for r in roots], batch_size=lambda: bs,
        sampling_info=_Greedy(bs), seq_lens=lens.clone(), seq_lens_cpu=lens.clone(),
        seq_lens_sum=int(lens.sum()), req_pool_indices=torch.arange(bs), tree_cache=alloc,
        req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token),
        token_to_kv_pool_allocator=alloc, has_grammar=False)
    block_ids = torch.full((bs, s.block), 7, dtype=torch.long)
    block_ids[:, 0] = roots
    head = types.SimpleNamespace(weight=weight, shard_indices=types.SimpleNamespace(
        num_added_elements=0, num_org_elements=s.vocab, num_org_elements_padded=s.vocab,
        org_vocab_start_index=0, added_vocab_start_index=s.vocab))
    hidden = torch.randn(bs * s.block, s.hidden, generator=gen).to(s.dtype)
    positions = lens.unsqueeze(1) + torch.arange(s.block)
    width = max(n, s.block)
    return Inputs(batch, hidden, block_ids, positions, head,
                  torch.randn(bs * width, s.vocab, generator=gen),
                  torch.randn(bs * width, s.hidden, generator=gen).to(s.dtype))


def _device_inputs(session: Session, x: Inputs) -> None:
    b = x.batch
    session.tracker.add([x.hidden, x.block_ids, x.positions_2d, x.lm_head.weight,
                         x.target_logits, x.target_hidden, b.seq_lens, b.req_pool_indices,
                         b.req_to_token_pool.req_to_token, b.tree_cache.free_pages])


def dflash_self(mods: Any, s: Sizes) -> Any:
    me = mods.base()
    me.block_size, me.page_size = s.block, 1
    me.model_runner = types.SimpleNamespace(attn_backend=TritonAttnBackend())
    me._draft_block_tokens_buf = torch.empty(s.bs, s.block, dtype=torch.long)
    return me


def ddtree_self(mods: Any, s: Sizes) -> Any:
    me = object.__new__(mods.worker.DDTreeWorker)
    me.ddtree_budget, me.ddtree_topk = s.budget, s.topk
    me.ddtree_shadow_linear, me.ddtree_score_chain = False, False
    me.block_size, me.page_size = s.block, 1
    me.model_runner = types.SimpleNamespace(attn_backend=TritonAttnBackend())
    for name, value in (("_rounds", 0), ("_tree_expected", None), ("_chain_expected", None)):
        setattr(me, name, value)
    # The eager round (0.2.2 replays it from CUDA graphs on a GPU; this counts what a graph holds)
    me._plan_graphs, me._walk_graphs = me._round_graphs(
        types.SimpleNamespace(cuda_graph_max_bs=0, disable_cuda_graph=True))
    return me


def run_round(me: Any, x: Inputs, s: Sizes, phase: Any = None,
              session: Session | None = None) -> dict[str, Any]:
    """One round: draft tail + prepare (phase 'prepare'), fake target, verify (phase 'verify')."""
    batch, bs = x.batch, s.bs
    draft_out = types.SimpleNamespace(hidden_states=x.hidden)
    with phase("prepare") if phase else contextlib.nullcontext():
        me.draft_tail(batch, draft_out, bs, x.block_ids, x.positions_2d, x.lm_head)
    spec = batch.spec_info
    n = spec.draft_token_num
    # The target forward (a copy of the fake's answer): not part of either path.
    with session.function.pause() if session else contextlib.nullcontext():
        logits_out = types.SimpleNamespace(next_token_logits=x.target_logits[: bs * n].clone(),
                                           hidden_states=x.target_hidden[: bs * n])
    if session:
        session.tracker.add([logits_out.next_token_logits, logits_out.hidden_states])
    with phase("verify") if phase else contextlib.nullcontext():
        new_id, commit, hidden, accepted = spec.verify(batch=batch, logits_output=logits_out,
                                                       page_size=1)
    return {"new_id": new_id, "commit": commit, "hidden": hidden, "accepted": accepted,
            "out_cache_loc": batch.out_cache_loc, "free_pages": batch.tree_cache.free_pages,
            "seq_lens": batch.seq_lens, "req_to_token": batch.req_to_token_pool.req_to_token,
            "mask": spec.custom_mask, "draft_token": spec.draft_token,
            "outputs": [list(r.output_ids) for r in batch.reqs]}


def count(mods: Any, session: Session, path: str, s: Sizes, weight: torch.Tensor) -> Counts:
    make = dflash_self if path == "dflash" else ddtree_self
    me = make(mods, s)
    warm = make_inputs(s, 0, weight)
    run_round(me, warm, s)  # first-call effects (imports, caches) stay out of the count
    x = make_inputs(s, 1, weight)
    session.counts = session.dispatch.counts = session.function.counts = Counts()
    _device_inputs(session, x)
    # no_grad, not inference_mode: under inference_mode a dispatch mode sees composite ops
    # (aten.to, aten.flatten) undecomposed, so no-op conversions would count as kernels.
    split: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        before = sum(session.counts.kernels.values())
        yield
        split[name] = sum(session.counts.kernels.values()) - before

    with torch.no_grad(), session.counting():
        run_round(me, x, s, phase, session=session)
    session.counts.split = split
    return session.counts


def timing(mods: Any, session: Session, path: str, s: Sizes, weight: torch.Tensor,
           rounds: int) -> dict[str, float]:
    make = dflash_self if path == "dflash" else ddtree_self
    me = make(mods, s)
    per: dict[str, list[float]] = {"prepare": [], "verify": [], "core": []}
    for r in range(rounds + 3):
        x = make_inputs(s, 100 + r, weight)
        times: dict[str, float] = {}

        @contextlib.contextmanager
        def phase(name: str, times: dict[str, float] = times) -> Iterator[None]:
            t0 = time.perf_counter_ns()
            yield
            times[name] = (time.perf_counter_ns() - t0) / 1e3

        session.core_ns = 0
        with torch.inference_mode():
            run_round(me, x, s, phase)
        times["core"] = session.core_ns / 1e3
        if r >= 3:
            for k, v in times.items():
                per[k].append(v)
    # The fastest round, not the median: on a shared machine the others are slowed by whatever
    # else runs, while the fastest is closest to the work itself.
    out = {k: min(v) for k, v in per.items()}
    out["round"] = min(p + v for p, v in zip(per["prepare"], per["verify"], strict=True))
    out["round_without_core"] = min(
        p + v - c for p, v, c in zip(per["prepare"], per["verify"], per["core"], strict=True))
    out["round_median"] = statistics.median(
        p + v - c for p, v, c in zip(per["prepare"], per["verify"], per["core"], strict=True))
    return out


def prefix_sized(a: Counts, b: Counts) -> tuple[int, list[str]]:
    """Elements (at ``a``'s prefix) of the device outputs whose size differs between runs."""
    if len(a.sizes) != len(b.sizes):
        return -1, ["op sequences differ between prefix lengths"]
    grown = [(na, ea) for (na, ea), (_, eb) in zip(a.sizes, b.sizes, strict=True) if ea != eb]
    return sum(e for _, e in grown), sorted({n for n, _ in grown})


def measure(mods: Any, session: Session, batches: list[int], rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for bs in batches:
        s = Sizes(bs)
        weight = torch.randn(s.vocab, s.hidden, generator=torch.Generator().manual_seed(9))
        weight = weight.to(s.dtype)
        # Timing: tiny sizes in float32 (CPU bf16 matmuls are slow and noisy) on one thread.
        tiny = Sizes(bs, vocab=512, hidden=64, dtype=torch.float32)
        tiny_weight = torch.randn(512, 64)
        for path in ("dflash", "ddtree"):
            c = count(mods, session, path, s, weight)
            c2 = count(mods, session, path, dataclasses.replace(s, prefix=2 * s.prefix), weight)
            grown, which = prefix_sized(c, c2)
            row: dict[str, Any] = dict(c.summary())
            row.update(kernels_prepare=c.split.get("prepare", 0),
                       kernels_verify=c.split.get("verify", 0), prefix_elements=grown,
                       prefix_ops=which, kernels_by_op=dict(c.kernels),
                       views_by_op=dict(c.views), syncs_by_kind=dict(c.syncs),
                       h2d_by_kind=dict(c.h2d), host_by_op=dict(c.host),
                       time_us=timing(mods, session, path, tiny, tiny_weight, rounds))
            out[f"{path}/bs{bs}"] = row
    return out


def table(results: dict[str, Any]) -> str:
    lines = ["| path, batch | kernels (of which Triton) [prepare + verify] | views/allocs "
             "| host ops | syncs | H2D "
             "| prefix-sized elements | CPU µs/round, core excluded | core's CPU path, µs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        t = r["time_us"]
        lines.append(f"| {key} | {r['kernels']} ({r['triton']}) [{r['kernels_prepare']} + "
                     f"{r['kernels_verify']}] | {r['views_allocs']} | "
                     f"{r['host_ops']} | {r['syncs']} | {r['h2d']} | {r['prefix_elements']} | "
                     f"{t['round_without_core']:.0f} | {t['core']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", help=f"path of {WHEEL}")
    ap.add_argument("--payload", type=Path, default=PAYLOAD,
                    help="payload folder to measure (default: this repository's; e.g. an older "
                         "one from `git archive REV payload | tar -x -C DIR`, then DIR/payload)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", type=Path, help="also write the raw counts here")
    ap.add_argument("--detail", action="store_true", help="print the kernels per op")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    session = Session()
    with tempfile.TemporaryDirectory() as tmp:
        mods = load(patched_package(find_wheel(args.wheel), Path(tmp), args.payload), session)
        results = measure(mods, session, args.batches, args.rounds)
    print(table(results))
    if args.detail:
        for key, r in results.items():
            print(f"\n{key}: kernels {r['kernels_by_op']}\n  syncs {r['syncs_by_kind']}"
                  f"\n  h2d {r['h2d_by_kind']}\n  host {r['host_by_op']}"
                  f"\n  prefix-sized ops {r['prefix_ops']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
