"""The payload's lighter host path (0.2.1) gives what the 0.2.0 path gave, on random rounds.

0.2.1 removed device work from a DDTREE round (benchmarks/ddtree_host_ops.py counts it): the KV
bookkeeping after the walk uses one host-computed slot order (``block_order``) instead of device
masks and three stable sorts; the custom mask's scatter offsets come from the host lengths; the
drafter's logits reach ``draft_topk`` without a float32 copy or a one-chunk concatenation; the
draft-expected accepts are computed only when read. Here the 0.2.0 formulations (kept below, or
still in ``ddtree_verify``: ``keep_mask``, ``select_first``) are the reference, and every output
of a round must be equal: committed tokens, commit lengths, new verified ids, the accept counts,
the kept and freed KV slots (in order), the req->token links, the lengths, the hidden states
passed to the drafter, the custom mask, the top-k.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "payload"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddtree import core
from test_payload_integration import (
    _Alloc,
    _assign,
    patched,  # noqa: F401  (fixture)
    sglang_path,  # noqa: F401  (fixture)
    upstream,  # noqa: F401  (fixture)
    verify_mods,  # noqa: F401  (fixture)
)
from test_payload_runtime import _worker_module

VOCAB = 40


def _old_tree_custom_mask(mask: torch.Tensor, prefix_lens: torch.Tensor,
                          total: int) -> torch.Tensor:
    """0.2.0's mask: the scatter index computed on the device from the device lengths."""
    bs, n, _ = mask.shape
    lens = prefix_lens.to(dtype=torch.long)
    row_len = lens + n
    starts = torch.cumsum(n * row_len, dim=0) - n * row_len
    index = (starts.view(bs, 1, 1) + torch.arange(n).view(1, n, 1) * row_len.view(bs, 1, 1)
             + lens.view(bs, 1, 1) + torch.arange(n).view(1, 1, n))
    flat = torch.ones(total, dtype=torch.bool)
    flat.scatter_(0, index.reshape(-1), mask.reshape(-1))
    return flat


class _Req:
    def __init__(self, prompt: list[int], root: int, stop_after: int | None) -> None:
        self.origin_input_ids, self.output_ids = prompt, [root]
        self.grammar, self.spec_verify_ct, self.spec_accepted_drafts = None, 0, 0
        self.kv_committed_len = self.kv_allocated_len = len(prompt)
        self.limit = None if stop_after is None else 1 + stop_after
        self.require_reasoning = False  # read by the verify since reasoning tokens are counted

    def check_finished(self) -> None:
        pass

    def finished(self) -> bool:
        return self.limit is not None and len(self.output_ids) >= self.limit


def _batch(lens: list[int], gen: torch.Generator, alloc: _Alloc, stops: list[int | None]) -> Any:
    bs = len(lens)
    req_to_token = torch.zeros(bs, max(lens) + 40, dtype=torch.long)
    for b, length in enumerate(lens):
        req_to_token[b, :length] = alloc.take(length)
    seq = torch.tensor(lens)
    roots = torch.randint(0, VOCAB, (bs,), generator=gen).tolist()
    return types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(is_idle=lambda: False), device="cpu",
        reqs=[_Req([1] * length, r, s) for length, r, s in zip(lens, roots, stops, strict=True)],
        batch_size=lambda: bs, sampling_info=None, seq_lens=seq.clone(), seq_lens_cpu=seq.clone(),
        seq_lens_sum=int(seq.sum()), req_pool_indices=torch.arange(bs), tree_cache=alloc,
        req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token),
        token_to_kv_pool_allocator=alloc)


def _target_logits(plan: Any, gen: torch.Generator) -> torch.Tensor:
    """The target's argmax after each slot: mostly one of the slot's children, so paths grow."""
    tokens, parents = plan.tree.tokens, plan.tree.parents
    bs, n = tokens.shape
    want = torch.randint(0, VOCAB, (bs, n), generator=gen)
    for b in range(bs):
        for i in range(n):
            children = [j for j in range(n) if int(parents[b, j]) == i and int(tokens[b, j]) >= 0]
            if children and float(torch.rand(1, generator=gen)) < 0.8:
                pick = children[int(torch.randint(0, len(children), (1,), generator=gen))]
                want[b, i] = tokens[b, pick]
    logits = torch.randn(bs * n, VOCAB, generator=gen)
    logits.scatter_(1, want.view(-1, 1), 50.0)
    return logits


def _old_bookkeeping(verify: Any, result: Any, loc: torch.Tensor, hidden: torch.Tensor,
                     commit_cpu: list[int], n: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """0.2.0's KV keep/free and hidden selection: device masks and stable sorts."""
    bs, steps = result.keep_slots.shape
    commit = torch.tensor(commit_cpu, dtype=torch.int32)
    committed = sum(commit_cpu)
    slots = result.keep_slots
    kept = verify.keep_mask(slots, commit, n)
    along = torch.arange(steps).expand(bs, steps) < commit.unsqueeze(1)
    block = loc.view(bs, n)
    freed = verify.select_first(block, ~kept, bs * n - committed).tolist()
    new_loc = verify.select_first(block.gather(1, slots.clamp(min=0)), along, committed)
    h = hidden.view(bs, n, -1)
    path_hidden = h.gather(1, slots.clamp(min=0).unsqueeze(2).expand(bs, steps, h.shape[2]))
    return freed, new_loc, verify.select_first(path_hidden, along, committed)


@pytest.mark.parametrize("seed", range(12))
def test_a_random_round_commits_links_and_frees_what_0_2_0_did(
        verify_mods: Any, seed: int) -> None:  # noqa: F811
    info, verify = verify_mods
    gen = torch.Generator().manual_seed(seed)
    bs = [1, 3, 8][seed % 3]
    depths, k, budget = 5, 3, [4, 9, 15][seed % 3]
    lens = torch.randint(1, 30, (bs,), generator=gen).tolist()
    stops = [None if float(torch.rand(1, generator=gen)) < 0.6 else
             int(torch.randint(1, 4, (1,), generator=gen)) for _ in range(bs)]
    alloc = _Alloc()
    batch = _batch(lens, gen, alloc, stops)
    top_lp, top_tok = core.draft_topk(torch.randn(bs, depths, VOCAB, generator=gen), k)
    roots = torch.tensor([r.output_ids[-1] for r in batch.reqs])
    plan = verify.plan_round(top_lp, top_tok, roots, batch.seq_lens, budget=budget,
                             shadow_linear=seed % 4 == 3, score_chain=False)
    spec = info.DDTreeVerifyInput.from_round(plan)
    spec.prepare_for_verify(batch, 1, build_custom_mask=True)
    n = spec.draft_token_num
    total = sum(n * (p + n) for p in lens)
    assert torch.equal(spec.custom_mask, _old_tree_custom_mask(plan.inputs.mask,
                                                               torch.tensor(lens), total))
    loc = batch.out_cache_loc.clone()
    links_before = batch.req_to_token_pool.req_to_token.clone()
    logits = _target_logits(plan, gen)
    hidden = torch.randn(bs * n, 6, generator=gen)
    out = types.SimpleNamespace(next_token_logits=logits.clone(), hidden_states=hidden.clone())
    new_id, commit, next_hidden, accepted = spec.verify(batch=batch, logits_output=out,
                                                        page_size=1)

    # The reference: 0.2.0's verify from the same walk.
    result = verify.finish_round(plan, logits.argmax(-1).view(bs, n))
    nacc = result.walk.num_accepted.tolist()
    want_commit: list[int] = []
    for b, req in enumerate(batch.reqs):
        proposed = result.new_tokens[b, : nacc[b] + 1].tolist()
        stop = stops[b]
        cut = len(proposed) if stop is None else min(len(proposed), stop)
        assert req.output_ids[1:] == proposed[:cut]
        want_commit.append(cut)
    assert commit.dtype == torch.int32 and commit.tolist() == want_commit
    assert accepted == [c - 1 for c in want_commit]
    assert new_id.dtype == torch.int64
    assert new_id.tolist() == [r.output_ids[-1] for r in batch.reqs]
    freed, new_loc, path_hidden = _old_bookkeeping(verify, result, loc, hidden, want_commit, n)
    assert alloc.freed == freed
    assert torch.equal(batch.out_cache_loc, new_loc)
    assert torch.equal(next_hidden, path_hidden)
    assert batch.seq_lens.tolist() == [p + c for p, c in zip(lens, want_commit, strict=True)]
    assert batch.seq_lens_cpu.tolist() == batch.seq_lens.tolist()
    assert batch.seq_lens_sum == sum(lens) + sum(want_commit)
    links = links_before.clone()  # after prepare: the whole block linked; verify relinks
    _assign(batch.req_pool_indices, links, torch.tensor(lens),
            torch.tensor(lens) + torch.tensor(want_commit), new_loc, bs)
    assert torch.equal(batch.req_to_token_pool.req_to_token, links)


def test_lazy_expected_accepts_equal_the_eager_ones(verify_mods: Any) -> None:  # noqa: F811
    _, verify = verify_mods
    gen = torch.Generator().manual_seed(3)
    lp, tok = core.draft_topk(torch.randn(4, 6, VOCAB, generator=gen), 4)
    roots, start = torch.arange(4), torch.full((4,), 9)
    plan = verify.plan_round(lp, tok, roots, start, budget=12, score_chain=True)
    assert torch.equal(plan.expected_accept, verify.expected_accept(plan.scored))
    chain = verify.chain_tree(lp, tok, roots)
    assert torch.equal(plan.chain_expected_accept, verify.expected_accept(chain))
    result = verify.finish_round(plan, torch.zeros_like(plan.tree.tokens))
    assert torch.equal(result.commit_lens, result.walk.num_accepted + 1)


def test_block_order_is_the_kept_path_then_the_freed_slots(verify_mods: Any) -> None:  # noqa: F811
    _, verify = verify_mods
    order = verify.block_order([[0, 3, 5, -1], [0, -1, -1, -1]], [2, 1], 6)
    assert order == [0, 3, 6] + [1, 2, 4, 5] + [7, 8, 9, 10, 11]


def _old_draft_topk(hidden: torch.Tensor, weight: torch.Tensor, k: int, start: int,
                    chunks: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """0.2.0's single-rank ``_draft_topk``: float32 logits, concatenated chunks, + start."""
    bs, depths, width = hidden.shape
    states = hidden.reshape(bs * depths, width)
    parts = [core.draft_topk(torch.matmul(states[lo:hi].to(weight.dtype), weight.T).float()
                             .unsqueeze(0), k) for lo, hi in chunks]
    lp = torch.cat([p[0][0] for p in parts], 0)
    tok = torch.cat([p[1][0] for p in parts], 0) + start
    return lp.view(bs, depths, -1), tok.view(bs, depths, -1)


@pytest.mark.parametrize(("dtype", "start", "chunk_rows"),
                         [(torch.bfloat16, 0, None), (torch.bfloat16, 7, 4),
                          (torch.float32, 0, 5), (torch.float16, 3, None)])
def test_draft_topk_without_the_float_copy_equals_0_2_0(
        sglang_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        dtype: torch.dtype, start: int, chunk_rows: int | None) -> None:
    worker = _worker_module(sglang_path, monkeypatch, types.SimpleNamespace(world_size=1))
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(3, 5, 16, generator=gen).to(dtype)
    weight = torch.randn(VOCAB + 2, 16, generator=gen).to(dtype)  # + 2 padding rows
    rows = 15
    chunks = [(0, rows)] if chunk_rows is None else \
        [(lo, min(rows, lo + chunk_rows)) for lo in range(0, rows, chunk_rows)]
    monkeypatch.setattr(sys.modules[worker.head_topk.__module__], "row_chunks",
                        lambda r, v, c: chunks)
    head = types.SimpleNamespace(weight=weight, shard_indices=types.SimpleNamespace(
        num_added_elements=0, num_org_elements=VOCAB, org_vocab_start_index=start))
    lp, tok = worker.DDTreeWorker._draft_topk(types.SimpleNamespace(ddtree_topk=6), hidden, head)
    want_lp, want_tok = _old_draft_topk(hidden, weight[:VOCAB], 6, start, chunks)
    assert torch.equal(lp, want_lp) and torch.equal(tok, want_tok)


# --- the counter of benchmarks/ddtree_host_ops.py (the table's instrument) ---------------------


def _counter() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import ddtree_host_ops

    return ddtree_host_ops


def test_the_counter_tells_device_syncs_from_host_reads() -> None:
    h = _counter()
    session = h.Session()
    dev, host = torch.arange(6), torch.arange(6)
    session.tracker.add(dev)
    with torch.no_grad(), session.counting():
        picked = dev[dev > 2]  # a boolean mask on a device tensor: nonzero, a sync
        copy = (dev + 1).cpu()  # one kernel, one D2H copy
        int(copy[0])  # a host read: no sync
        host.tolist()  # a host read: no sync
        made = torch.zeros(3, device="cpu")  # a factory given a device: a kernel on the GPU
        staged = torch.tensor([1, 2], device="cpu")  # one H2D copy, blocking: a sync
        quiet = torch.tensor([3]).to("cpu", non_blocking=True)  # one H2D copy, no wait
        (made + staged[:1] + quiet).view(3)
    c = session.counts.summary()
    assert session.counts.syncs == {"index (bool mask)": 1, "D2H copy (.cpu())": 1,
                                    "H2D blocking (tensor(device=))": 1}
    assert c["h2d"] == 2
    assert session.counts.kernels["add"] == 3 and session.counts.kernels["zeros"] == 1
    assert session.counts.views["view"] >= 1 and session.counts.host["_local_scalar_dense"] == 1
    assert session.tracker.has(picked) and not session.tracker.has(copy)


def test_the_counter_counts_a_triton_core_call_as_its_launches() -> None:
    h = _counter()
    session = h.Session()
    build = session.triton("build_tree", core.build_tree)
    lp, tok = core.draft_topk(torch.randn(1, 3, 9), 3)
    roots = torch.tensor([1])
    session.tracker.add([lp, tok, roots])
    with torch.no_grad(), session.counting():
        tree = build(lp, tok, roots, 4)
    launches, allocs = h.TRITON_CORE["build_tree"]
    assert session.counts.kernels == {"triton": launches}
    assert session.counts.views == {"empty": allocs}
    assert session.tracker.has(tree.tokens) and session.tracker.has(tree.parents)
