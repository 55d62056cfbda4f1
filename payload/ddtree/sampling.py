"""Sampled verification for DDTree: the target's own sample at every tree slot, in pure torch.

Greedy verification follows the child whose token is the target's argmax. For a request with
temperature > 0 the exact counterpart is to *sample* the target's token after every slot (with
the request's temperature, top-k, top-p and min-p) and follow the child that holds it; the first
slot whose sample no child holds ends the path, and that sample is the bonus token. Every token
committed is then one draw from the target's distribution given the tokens before it (the samples
of different slots are independent, and only the slots along the followed path are read), so the
output has the target's distribution whatever the drafter proposed: the tree only decides how
many of those draws a round gets. :func:`ddtree.core.walk_tree` does the walk unchanged when
given these samples instead of the argmax.

The filters are those of SGLang's own sampler (``sampler.py``'s pytorch path; flashinfer's
"joint" order): top-k, then top-p measured on the *full* distribution's probabilities (a token is
kept while the mass of the better tokens is at most top-p), then min-p against the largest kept
probability; the kept tokens are renormalised. So a DDTREE request samples what the same request
samples without speculation. (DFLASH in 0.5.11 measures top-p on the probabilities renormalised
over the top-k, which keeps fewer tokens; it ignores min-p.) A greedy request (SGLang gives it
top-k 1) gets its argmax. The draw is the exponential race (``argmax p_i / E_i`` with
``E_i ~ Exp(1)``), an exact categorical sample with no host synchronisation. Rows are processed in
chunks so that the ``[rows, vocab]`` float32 temporaries stay bounded; where no row restricts the
vocabulary (every sampled row's top-k unset, top-p 1, no min-p) the full softmax is sampled
without sorting. That shortcut is keyed on the *smallest* top-k of the rows that sample: keyed on
the largest (payload 0.2.2), a top-k 2 row sharing a batch with rows that leave top-k unset
sampled the whole vocabulary (issue 25, seen on the H200).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["filtered_probs", "sample_tokens", "top_k_bounds"]

CHUNK_ELEMENTS = 1 << 25  # float32 elements per temporary (128 MiB)


def top_k_bounds(top_ks: Iterable[int]) -> tuple[int, int]:
    """``(largest, smallest)`` top-k among the rows that sample (top-k > 1), from the host's
    requests (no device read); ``(1, 1)`` when every row is greedy. ``sample_tokens``'s
    ``max_top_k`` and ``min_top_k``."""
    sampled = [int(k) for k in top_ks if int(k) > 1]
    return max(sampled, default=1), min(sampled, default=1)


def filtered_probs(
    logits: Tensor,
    temperatures: Tensor,
    top_ks: Tensor,
    top_ps: Tensor,
    min_ps: Tensor | None = None,
    *,
    max_top_k: int | None = None,
    top_p_after_top_k: bool = False,
) -> tuple[Tensor, Tensor]:
    """The filtered target distribution over each row's top-k: ``(probs, token_ids)``.

    ``logits [R, V]``; ``temperatures``, ``top_ks``, ``top_ps``, ``min_ps`` are ``[R]``.
    Returns ``[R, K]`` float32 probabilities (summing to 1, zeros where filtered out) and the
    ``[R, K]`` int64 vocabulary ids they belong to, with ``K = min(max(top_ks), V)``
    (``max_top_k``, when the caller knows it on the host, saves reading it from the device).

    ``top_p_after_top_k``: SGLang's flashinfer backend when a batch has a min-p row
    (``sampler.py``: ``top_k_renorm_prob``, then ``top_p_renorm_prob``, then min-p): top-p is
    measured on the probabilities renormalised over the top-k, and a token is kept while the
    mass before it is below top-p (flashinfer keeps the smallest set that reaches it).
    """
    rows, vocab = logits.shape
    dev = logits.device
    ks = top_ks.to(device=dev, dtype=torch.int64).clamp(min=1, max=vocab)
    if max_top_k is None:
        max_top_k = int(ks.max()) if rows else 1
    k = max(1, min(int(max_top_k), vocab))
    scaled = logits.float() / temperatures.to(device=dev, dtype=torch.float32).view(-1, 1)
    total = torch.logsumexp(scaled, dim=-1, keepdim=True)  # the full distribution's normaliser
    top_logits, top_ids = torch.topk(scaled, k, dim=-1, largest=True, sorted=True)
    full = torch.exp(top_logits - total)  # probabilities under the whole vocabulary
    ranks = torch.arange(k, device=dev).view(1, -1)
    in_k = ranks < ks.view(-1, 1)
    before = torch.cumsum(full, dim=-1) - full  # mass of the better tokens
    ps = top_ps.to(device=dev, dtype=torch.float32).view(-1, 1)
    if top_p_after_top_k:
        topk_mass = torch.where(in_k, full, 0.0).sum(dim=-1, keepdim=True)
        within = (before / topk_mass) < ps
    else:
        within = before <= ps
    keep = in_k & (within | (ps >= 1.0) | (ranks == 0))
    probs = torch.where(keep, full, 0.0)
    if min_ps is not None:
        floor = probs[:, :1] * min_ps.to(device=dev, dtype=torch.float32).view(-1, 1)
        probs = torch.where(probs >= floor, probs, 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs, top_ids


def sample_tokens(
    logits: Tensor,
    temperatures: Tensor,
    top_ks: Tensor,
    top_ps: Tensor,
    min_ps: Tensor | None = None,
    *,
    max_top_k: int | None = None,
    min_top_k: int | None = None,
    need_top_p: bool = True,
    top_p_after_top_k: bool = False,
    generator: torch.Generator | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> Tensor:
    """One sample per row of ``logits [R, V]`` under each row's filters -> ``[R]`` int64.

    ``max_top_k`` and ``min_top_k``: the largest and the smallest top-k among the rows that
    sample (greedy rows, top-k 1, take their argmax whatever it is), known on the host;
    ``need_top_p``: whether any row has top-p < 1. Only when even the smallest top-k covers the
    vocabulary, no row has top-p < 1 and there is no min-p is the sort skipped: each row keeps
    its own filters whatever its batch-mates ask.
    """
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    greedy = top_ks.to(device=logits.device).view(-1) <= 1
    dense = min_top_k is not None and min_top_k >= vocab and not need_top_p and min_ps is None
    step = max(1, chunk_elements // max(1, vocab))
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        if dense:
            scaled = logits[lo:hi].float() / temperatures[lo:hi].to(
                device=logits.device, dtype=torch.float32).view(-1, 1)
            probs = torch.softmax(scaled, dim=-1)
            race = torch.empty_like(probs).exponential_(1.0, generator=generator)
            picked = torch.argmax(probs / race, dim=-1)
        else:
            probs, ids = filtered_probs(
                logits[lo:hi], temperatures[lo:hi], top_ks[lo:hi], top_ps[lo:hi],
                None if min_ps is None else min_ps[lo:hi],
                max_top_k=None if max_top_k is None else max(1, max_top_k),
                top_p_after_top_k=top_p_after_top_k,
            )  # fmt: skip
            race = torch.empty_like(probs).exponential_(1.0, generator=generator)
            pick = torch.argmax(probs / race, dim=-1, keepdim=True)
            picked = ids.gather(1, pick).squeeze(1)
        out[lo:hi] = torch.where(greedy[lo:hi], torch.argmax(logits[lo:hi], dim=-1), picked)
    return out
