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

The filters follow DFLASH's sampled verify in SGLang 0.5.11 (top-k first, probabilities
renormalised over the top-k, then top-p over the renormalised probabilities) and add min-p as
SGLang's own sampler does (tokens below ``min_p x`` the largest kept probability dropped). A
greedy request (SGLang gives it top-k 1) gets its argmax. The draw is the exponential race
(``argmax p_i / E_i`` with ``E_i ~ Exp(1)``), an exact categorical sample with no host
synchronisation. Rows are processed in chunks so that the ``[rows, vocab]`` float32 temporaries
stay bounded.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["filtered_probs", "sample_tokens"]

CHUNK_ELEMENTS = 1 << 25  # float32 elements per temporary (128 MiB)


def filtered_probs(
    logits: Tensor,
    temperatures: Tensor,
    top_ks: Tensor,
    top_ps: Tensor,
    min_ps: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The filtered target distribution over each row's top-k: ``(probs, token_ids)``.

    ``logits [R, V]``; ``temperatures``, ``top_ks``, ``top_ps``, ``min_ps`` are ``[R]``.
    Returns ``[R, K]`` float32 probabilities (summing to 1, zeros where filtered out) and the
    ``[R, K]`` int64 vocabulary ids they belong to, with ``K = min(max(top_ks), V)``.
    """
    rows, vocab = logits.shape
    dev = logits.device
    ks = top_ks.to(device=dev, dtype=torch.int64).clamp(min=1, max=vocab)
    k = int(ks.max()) if rows else 1
    scaled = logits.float() / temperatures.to(device=dev, dtype=torch.float32).view(-1, 1)
    top_logits, top_ids = torch.topk(scaled, k, dim=-1, largest=True, sorted=True)
    ranks = torch.arange(k, device=dev).view(1, -1)
    top_logits = top_logits.masked_fill(ranks >= ks.view(-1, 1), float("-inf"))
    probs = torch.softmax(top_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the better tokens
    ps = top_ps.to(device=dev, dtype=torch.float32).view(-1, 1)
    probs = torch.where((before < ps) | (ranks == 0), probs, 0.0)
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
    generator: torch.Generator | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> Tensor:
    """One sample per row of ``logits [R, V]`` under each row's filters -> ``[R]`` int64."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    step = max(1, chunk_elements // max(1, vocab))
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        probs, ids = filtered_probs(
            logits[lo:hi],
            temperatures[lo:hi],
            top_ks[lo:hi],
            top_ps[lo:hi],
            None if min_ps is None else min_ps[lo:hi],
        )
        race = torch.empty_like(probs).exponential_(1.0, generator=generator)
        pick = torch.argmax(probs / race, dim=-1, keepdim=True)
        out[lo:hi] = ids.gather(1, pick).squeeze(1)
    return out
