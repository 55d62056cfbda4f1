"""The drafter's per-depth top-k over a (vocabulary-parallel) LM head, in bounded memory.

DDTree needs, for every draft row (request x depth), the top-k log-probabilities of the drafter's
distribution over the whole vocabulary. Materialising ``[rows, vocab]`` float32 logits at once
costs ``rows x vocab x 4`` bytes (about 650 MB at 48 requests x 15 depths x 152k tokens), so the
rows are taken in chunks: the head's matmul, the top-k and the log-sum-exp of one chunk at a time.

With tensor parallelism each rank holds a shard of the vocabulary. Each rank reports its shard's
top-k logits, their vocabulary ids and its shard's log-sum-exp; :func:`merge_topk` turns the
gathered reports into the unsharded top-k log-probabilities. Every rank reports exactly ``k``
entries (padded with ``-inf`` and id 0 where its shard holds fewer than ``k`` tokens), so the
all-gathers have the same size on every rank whatever the shard sizes; padded entries can never
win against a real token, and where the whole vocabulary is smaller than ``k`` they come out as
``-inf`` log-probabilities, which :func:`ddtree.core.build_tree` treats as padding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["CHUNK_ELEMENTS", "head_topk", "local_topk", "merge_topk", "row_chunks",
           "topk_logprobs"]

CHUNK_ELEMENTS = 1 << 25  # float32 logits per chunk (128 MiB)


def row_chunks(
    rows: int, vocab: int, chunk_elements: int = CHUNK_ELEMENTS
) -> list[tuple[int, int]]:
    """``[lo, hi)`` row ranges whose ``[hi - lo, vocab]`` logits hold at most ``chunk_elements``."""
    step = max(1, chunk_elements // max(1, vocab))
    return [(lo, min(rows, lo + step)) for lo in range(0, rows, step)]


def local_topk(
    states: Tensor,
    weight: Tensor,
    k: int,
    *,
    vocab_start: int = 0,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor, Tensor]:
    """One shard's report: ``(logits [R, k] sorted desc, ids [R, k], lse [R])``, all float32/int64.

    ``states [R, H]`` are the drafter's hidden states, ``weight [V_shard, H]`` the shard of the LM
    head whose first row is vocabulary id ``vocab_start``.
    """
    rows = states.shape[0]
    vocab = weight.shape[0]
    dev = states.device
    values = torch.full((rows, k), float("-inf"), dtype=torch.float32, device=dev)
    ids = torch.zeros((rows, k), dtype=torch.int64, device=dev)
    lse = torch.full((rows,), float("-inf"), dtype=torch.float32, device=dev)
    take = min(k, vocab)
    if take == 0:
        return values, ids, lse
    for lo, hi in row_chunks(rows, vocab, chunk_elements):
        logits = torch.matmul(states[lo:hi].to(weight.dtype), weight.T).float()
        top, where = torch.topk(logits, take, dim=-1, largest=True, sorted=True)
        values[lo:hi, :take] = top
        ids[lo:hi, :take] = where + vocab_start
        lse[lo:hi] = torch.logsumexp(logits, dim=-1)
    return values, ids, lse


def merge_topk(values: Tensor, ids: Tensor, lse: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Merge the shards' reports into the unsharded top-k: ``(logprobs [R, k], ids [R, k])``.

    ``values``/``ids`` are ``[T, R, k]`` and ``lse`` is ``[T, R]`` for ``T`` shards (rank order).
    """
    shards, rows, width = values.shape
    total = torch.logsumexp(lse, dim=0)  # [R]
    logprobs = (values - total.view(1, rows, 1)).permute(1, 0, 2).reshape(rows, shards * width)
    flat_ids = ids.permute(1, 0, 2).reshape(rows, shards * width)
    take = min(k, shards * width)
    top, where = torch.topk(logprobs, take, dim=-1, largest=True, sorted=True)
    return top + 0.0, flat_ids.gather(1, where)


Gather = Callable[[Tensor], Tensor]
"""All-gather along a new leading dimension: ``[...] -> [T, ...]`` in rank order."""


def topk_logprobs(
    states: Tensor,
    weight: Tensor,
    k: int,
    *,
    vocab_start: int = 0,
    world_size: int = 1,
    gather: Gather | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """Top-k log-probabilities of ``states`` over the whole (possibly sharded) vocabulary."""
    values, ids, lse = local_topk(
        states, weight, k, vocab_start=vocab_start, chunk_elements=chunk_elements
    )
    if world_size == 1:
        return merge_topk(values.unsqueeze(0), ids.unsqueeze(0), lse.unsqueeze(0), k)
    if gather is None:
        raise ValueError("a vocabulary-parallel head needs a gather function")
    return merge_topk(gather(values), gather(ids), gather(lse), k)


TopK = Callable[[Tensor, int], tuple[Tensor, Tensor]]
"""``ddtree.core.draft_topk``: ``([bs, D, V] logits, k) -> (logprobs, ids)``, ``[bs, D, k]``."""


def head_topk(
    hidden: Tensor,
    lm_head: Any,
    k: int,
    group: Any,
    topk: TopK,
    *,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """Per-depth top-k log-probs of the drafter over the (vocab-parallel) target head; the
    workers of both payload forms take their draft's top-k from here.

    ``hidden [bs, D, H]`` -> ``([bs, D, K], [bs, D, K])``, in row chunks of bounded memory.
    ``lm_head`` is SGLang's ``VocabParallelEmbedding`` (``weight``, ``shard_indices``),
    ``group`` its tensor-parallel group (``world_size``, ``all_gather_into_tensor``) and
    ``topk`` the core's ``draft_topk`` (imported by the caller: this module's own name differs
    between the forms). With TP > 1 every rank reports exactly K entries (padded where its shard
    is smaller), so the all-gathers match across ranks and the merge equals the unsharded top-k.
    """
    bs, depths, width = hidden.shape
    shard = lm_head.shard_indices
    if int(shard.num_added_elements) != 0:
        raise RuntimeError("DDTREE does not support added-vocabulary (LoRA) LM heads yet.")
    num_org = int(shard.num_org_elements)
    weight = lm_head.weight[:num_org]
    states = hidden.reshape(bs * depths, width)
    start = int(shard.org_vocab_start_index)
    world = int(group.world_size)
    if world == 1:
        # The head's logits go to the top-k in their own dtype: it works in float32 (the Triton
        # kernel converts on load, the torch path with .float()), so no float32 copy of
        # [rows, vocab] is made here. One chunk (the usual case) needs no concatenation.
        parts = [
            topk(torch.matmul(states[lo:hi].to(weight.dtype), weight.T).unsqueeze(0), k)
            for lo, hi in row_chunks(bs * depths, num_org, chunk_elements)
        ]
        if len(parts) == 1:
            logprobs, tokens = parts[0][0][0], parts[0][1][0]
        else:
            logprobs = torch.cat([p[0][0] for p in parts], 0)
            tokens = torch.cat([p[1][0] for p in parts], 0)
        if start:
            tokens = tokens + start
        k = logprobs.shape[-1]
        return logprobs.view(bs, depths, k), tokens.view(bs, depths, k)

    def gather(t: Tensor) -> Tensor:
        out = t.new_empty((world, *t.shape))
        group.all_gather_into_tensor(out.view(world * t.shape[0], *t.shape[1:]), t.contiguous())
        return out

    logprobs, tokens = topk_logprobs(
        states, weight, k, vocab_start=start, world_size=world, gather=gather,
        chunk_elements=chunk_elements,
    )
    return logprobs.view(bs, depths, k), tokens.view(bs, depths, k)
