"""DDTree core: build, compile and walk a draft tree, batched, in pure torch.

DDTree (Ringel & Romano, arXiv 2604.12989) turns one block-diffusion draft pass into a tree of
candidate continuations under a node budget and verifies the whole tree in one target forward
pass with an ancestor-only attention mask. This module is the algorithmic core only; it needs
nothing but torch so that it can be copied into an inference engine as a single file.

Backends: every public function takes ``backend="auto" | "torch" | "triton"``. The pure-torch
code below is the reference and the CPU path. Where Triton imports and the tensors are on CUDA,
"auto" runs the fused kernels of ``triton_kernels.py`` (shipped as
``sglang.srt.speculative.ddtree_triton``): one kernel each for build, compile and walk, two for
the vocabulary top-k, instead of about 130 small torch kernels. They produce the same trees,
masks and walks bit for bit; ``draft_topk``'s log-probabilities may differ from
``torch.log_softmax``'s in the last bits (its normaliser is summed in another order).

Every function is batched over requests, runs on CPU and CUDA, and does no host synchronisation
(no ``.item()``, ``.tolist()``, ``.cpu()``, boolean indexing or data-dependent shapes): all shapes
depend only on ``batch``, ``budget``, the number of depths ``D`` and ``top_k``, so a whole round
can be captured in a CUDA graph.

Data layout (``bs`` requests, budget ``B``, ``N = B + 1`` tree slots, ``D`` depths, top-k ``K``)
----------------------------------------------------------------------------------------------
* Draft input: ``top_logprobs [bs, D, K]`` float (sorted descending along K) and
  ``top_tokens [bs, D, K]`` int64 from :func:`draft_topk`; row ``d`` is the drafter's distribution
  for the token ``d + 1`` steps after the root (block size 16 gives D = 15).
* Tree (:class:`DDTree`): slot 0 is the root, holding the previous bonus token (depth 0, score 0,
  parent -1). Slots 1..B are the chosen nodes in selection order (the order the paper's best-first
  heap pops them), so a parent's slot is always smaller than its children's. A node at depth d
  that uses rank r of row d - 1 has token ``top_tokens[d - 1, r]`` and score = sum of the chosen
  log-probabilities along its path. When fewer than B nodes have a finite score (tiny
  vocabularies, D = 1, masked tokens), the remaining slots are padding: ``valid`` False,
  token -1, parent 0, depth 1, score -inf; they are never accepted.
* Verify inputs (:class:`VerifyInputs`): ``input_ids [bs, N]`` (padding -> ``pad_token_id``),
  ``positions [bs, N] = start + depth``, ``mask [bs, N, N]`` bool with ``mask[b, i, j]`` True iff
  slot j is slot i or one of its ancestors, ``additive_mask`` (0 where allowed, -inf elsewhere).
  The mask covers the tree block only; every tree slot also sees the whole committed prefix.
* Walk (:class:`WalkResult`): ``target_tokens [bs, N]`` is the target's choice after each slot
  (argmax at temperature 0). ``path [bs, D + 1]`` lists the accepted slots by depth, root first,
  padded with -1: these are the tree slots whose KV entries are kept. ``num_accepted [bs]`` counts
  accepted draft tokens (root excluded), ``bonus [bs]`` is the target's token after the deepest
  accepted slot, ``new_tokens [bs, D + 1]`` are the accepted draft tokens followed by the bonus
  token, padded with -1 (``num_accepted + 1`` of them are real).

Selection rule
--------------
The tree is the set of B nodes that the best-first heap pops from the top-K-per-depth tree: it
starts with (depth 1, rank 0); each pop adds a node and offers its next sibling and its first
child. Ties are broken by the key (score desc, depth asc, parent slot asc, rank asc). Scores never
increase from a node to its first child (log-probabilities are <= 0) nor from a node to its next
sibling (ranks are sorted), and the key respects both, so the heap pops nodes exactly in key order
and the result is the first B nodes of the whole K-ary tree in that order.

Instead of a heap this module works depth by depth: the best B nodes of depth d (within-depth
order: score desc, parent's within-depth position asc, rank asc) are all children of the best B
nodes of depth d - 1, because each better parent's first child beats or ties-before any child of a
worse parent. A stable descending sort of the B x K candidates (laid out parent-major,
rank-minor) yields them in exactly that order. A final stable sort over the D x B survivors (laid
out depth-major) orders them globally; its first B entries are the heap's B pops, in pop order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def _load_kernels() -> Any:
    """The Triton kernels, from inside SGLang or beside this file; None where Triton is missing."""
    try:
        from sglang.srt.speculative import ddtree_triton

        return ddtree_triton
    except Exception:  # any failure means: no fast path here
        pass
    try:
        from ddtree import triton_kernels

        return triton_kernels
    except Exception:
        return None


_KERNELS = _load_kernels()
_BACKENDS = ("auto", "torch", "triton")

__all__ = [
    "DDTree",
    "VerifyInputs",
    "WalkResult",
    "ancestor_mask",
    "build_tree",
    "compile_tree",
    "draft_topk",
    "triton_available",
    "walk_tree",
]


@dataclass(frozen=True)
class DDTree:
    """A batch of draft trees with a fixed number of slots (see the module docstring)."""

    tokens: Tensor  # [bs, N] int64, root = previous bonus token, padding -1
    parents: Tensor  # [bs, N] int64, root -1
    depths: Tensor  # [bs, N] int64, root 0
    ranks: Tensor  # [bs, N] int64, rank of the node's token in its depth's top-k (root 0)
    scores: Tensor  # [bs, N] float32 cumulative path log-probability, root 0, padding -inf
    valid: Tensor  # [bs, N] bool, root True
    max_depth: int  # D, the number of draft depths


@dataclass(frozen=True)
class VerifyInputs:
    """What the target's tree forward pass needs."""

    input_ids: Tensor  # [bs, N] int64
    positions: Tensor  # [bs, N] int64
    mask: Tensor  # [bs, N, N] bool, True = may attend
    additive_mask: Tensor  # [bs, N, N] 0 / -inf


@dataclass(frozen=True)
class WalkResult:
    """The outcome of a greedy walk over a verified tree."""

    path: Tensor  # [bs, D + 1] int64 accepted slots by depth, root first, padded -1
    num_accepted: Tensor  # [bs] int64 accepted draft tokens (root and bonus excluded)
    bonus: Tensor  # [bs] int64 the target's next token after the accepted path
    new_tokens: Tensor  # [bs, D + 1] int64 accepted tokens then the bonus, padded -1


def triton_available() -> bool:
    """Whether the Triton kernels imported (they still run only on CUDA tensors)."""
    return _KERNELS is not None


def _use_triton(backend: str, t: Tensor, supported: bool = True) -> bool:
    """Resolve ``backend`` for a call whose tensors live where ``t`` does."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
    if backend == "torch":
        return False
    if backend == "triton":
        if _KERNELS is None:
            raise ValueError("backend 'triton' needs the triton package, which did not import")
        if not supported:
            raise ValueError("backend 'triton' does not handle these sizes; use 'auto' or 'torch'")
        return True
    return _KERNELS is not None and t.is_cuda and supported


def draft_topk(draft_logits: Tensor, top_k: int, *, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """Per-depth top-k of the drafter's log-probabilities.

    ``draft_logits [bs, D, V]`` (logits or log-probabilities) -> ``(logprobs, tokens)``, both
    ``[bs, D, min(top_k, V)]``, sorted by descending log-probability; logprobs are float32.
    """
    if draft_logits.dim() != 3:
        raise ValueError(f"draft_logits must be [batch, depths, vocab], got {_shape(draft_logits)}")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    k = min(top_k, draft_logits.shape[-1])
    if _use_triton(backend, draft_logits, supported=k <= 64) and _KERNELS is not None:
        bs, depths, vocab = draft_logits.shape
        lp, tok = _KERNELS.topk_logprobs(draft_logits.reshape(bs * depths, vocab), k)
        return lp.view(bs, depths, k), tok.view(bs, depths, k)
    logprobs = torch.log_softmax(draft_logits.float(), dim=-1)
    values, tokens = torch.topk(logprobs, k, dim=-1, largest=True, sorted=True)
    return values + 0.0, tokens  # + 0.0 turns a -0.0 into +0.0 so it cannot sort apart


def build_tree(
    top_logprobs: Tensor,
    top_tokens: Tensor,
    root_tokens: Tensor,
    budget: int,
    *,
    backend: str = "auto",
) -> DDTree:
    """Choose the ``budget`` best nodes of the top-k-per-depth tree (heap order, see module doc).

    ``top_logprobs``/``top_tokens``: ``[bs, D, K]``, sorted descending along K;
    ``root_tokens``: ``[bs]`` previous bonus tokens. Returns a tree with ``budget + 1`` slots.
    """
    if top_logprobs.dim() != 3 or top_tokens.shape != top_logprobs.shape:
        raise ValueError(
            "top_logprobs and top_tokens must both be [batch, depths, k], got "
            f"{_shape(top_logprobs)} and {_shape(top_tokens)}"
        )
    bs, depths, k = top_logprobs.shape
    if depths < 1 or k < 1:
        raise ValueError(f"need at least one depth and k >= 1, got {_shape(top_logprobs)}")
    if budget < 1:
        raise ValueError(f"budget must be at least 1, got {budget}")
    if root_tokens.shape != (bs,):
        raise ValueError(f"root_tokens must be [{bs}], got {_shape(root_tokens)}")
    supported = _KERNELS is not None and _KERNELS.build_supported(depths, k, budget)
    if _use_triton(backend, top_logprobs, supported) and _KERNELS is not None:
        tokens, parents, depth_of, ranks, scores, valid = _KERNELS.build(
            top_logprobs, top_tokens, root_tokens, budget
        )
        return DDTree(tokens, parents, depth_of, ranks, scores, valid, max_depth=depths)
    dev = top_logprobs.device
    logprobs = top_logprobs.float()
    neg_inf = float("-inf")

    # Level 0 holds only the root (local index 0); the other B - 1 entries are padding.
    level = torch.full((bs, budget), neg_inf, dtype=torch.float32, device=dev)
    level[:, 0] = 0.0
    level_scores: list[Tensor] = []
    level_cands: list[Tensor] = []
    for d in range(depths):
        # Candidate c = parent_local * K + rank; the stable sort keeps that order on ties.
        cands = (level.unsqueeze(2) + logprobs[:, d].unsqueeze(1)).reshape(bs, budget * k)
        values, index = torch.sort(cands, dim=1, descending=True, stable=True)
        level = values[:, :budget]
        level_scores.append(level)
        level_cands.append(index[:, :budget])
    survivors = torch.stack(level_scores, dim=1).reshape(bs, depths * budget)
    cand_of = torch.stack(level_cands, dim=1).reshape(bs, depths * budget)

    # Global order: score desc, then depth asc, then within-depth position asc (stable sort).
    g_scores, g_flat = torch.sort(survivors, dim=1, descending=True, stable=True)
    g_scores = g_scores[:, :budget]
    g_flat = g_flat[:, :budget]
    depth0 = torch.div(g_flat, budget, rounding_mode="floor")  # 0-based depth index
    cand = cand_of.gather(1, g_flat)
    parent_local = torch.div(cand, k, rounding_mode="floor")
    rank = cand - parent_local * k
    token = top_tokens.reshape(bs, depths * k).gather(1, depth0 * k + rank)

    # Slot of every survivor that was chosen (slots 1..B); parents are always chosen.
    slots = torch.arange(1, budget + 1, device=dev, dtype=torch.long).expand(bs, budget)
    slot_of = torch.zeros(bs, depths * budget, dtype=torch.long, device=dev)
    slot_of.scatter_(1, g_flat, slots)
    parent_flat = (depth0 - 1).clamp(min=0) * budget + parent_local
    parent = torch.where(depth0 == 0, 0, slot_of.gather(1, parent_flat))

    valid = g_scores > neg_inf
    one = torch.ones_like(depth0)
    root_col = torch.zeros(bs, 1, dtype=torch.long, device=dev)
    roots = root_tokens.to(torch.long).unsqueeze(1)
    return DDTree(
        tokens=torch.cat([roots, torch.where(valid, token, -1)], 1),
        parents=torch.cat([root_col - 1, torch.where(valid, parent, 0)], 1),
        depths=torch.cat([root_col, torch.where(valid, depth0 + 1, one)], 1),
        ranks=torch.cat([root_col, torch.where(valid, rank, 0)], 1),
        scores=torch.cat([torch.zeros(bs, 1, device=dev), g_scores], 1),
        valid=torch.cat([torch.ones(bs, 1, dtype=torch.bool, device=dev), valid], 1),
        max_depth=depths,
    )


def ancestor_mask(parents: Tensor, max_depth: int) -> Tensor:
    """``[bs, N, N]`` bool: ``mask[b, i, j]`` iff slot j is slot i or an ancestor of slot i.

    ``parents [bs, N]`` with -1 at the root; ``max_depth`` bounds the depth of every slot.
    Pointer jumping: after each step the covered distance doubles.
    """
    bs, n = parents.shape
    ptr = parents.clamp(min=0)  # the root points at itself
    eye = torch.eye(n, dtype=torch.bool, device=parents.device)
    mask = eye.expand(bs, n, n).clone()
    mask.scatter_(2, ptr.unsqueeze(2), True)
    reach = 1
    while reach < max_depth:
        mask = mask | mask.gather(1, ptr.unsqueeze(2).expand(bs, n, n))
        ptr = ptr.gather(1, ptr)
        reach *= 2
    return mask


def compile_tree(
    tree: DDTree,
    start_positions: Tensor,
    pad_token_id: int = 0,
    mask_dtype: torch.dtype = torch.float32,
    *,
    backend: str = "auto",
) -> VerifyInputs:
    """Verify inputs for the target: ids, positions ``start + depth`` and the ancestor mask.

    ``start_positions [bs]`` is the position of the root (the previous bonus token).
    """
    bs = tree.tokens.shape[0]
    if start_positions.shape != (bs,):
        raise ValueError(f"start_positions must be [{bs}], got {_shape(start_positions)}")
    if _use_triton(backend, tree.parents) and _KERNELS is not None:
        ids, positions, mask, additive = _KERNELS.compile_verify(
            tree.parents, tree.tokens, tree.depths, start_positions, tree.max_depth,
            pad_token_id, mask_dtype,
        )  # fmt: skip
        return VerifyInputs(ids, positions, mask, additive)
    mask = ancestor_mask(tree.parents, tree.max_depth)
    additive = torch.where(mask, 0.0, float("-inf")).to(mask_dtype)
    return VerifyInputs(
        input_ids=torch.where(tree.tokens >= 0, tree.tokens, pad_token_id),
        positions=start_positions.to(torch.long).unsqueeze(1) + tree.depths,
        mask=mask,
        additive_mask=additive,
    )


def walk_tree(
    tree: DDTree, target_tokens: Tensor, mask: Tensor, *, backend: str = "auto"
) -> WalkResult:
    """Greedy walk: follow the child whose token the target chose; the first miss is the bonus.

    ``target_tokens [bs, N]``: the target's token after each slot; ``mask``: the bool ancestor
    mask from :func:`compile_tree`. Siblings hold distinct tokens, so the accepted slots form one
    path; a slot is accepted iff it and all its ancestors match their parent's target token.
    """
    if target_tokens.shape != tree.tokens.shape:
        raise ValueError(
            f"target_tokens must be {_shape(tree.tokens)}, got {_shape(target_tokens)}"
        )
    if _use_triton(backend, tree.tokens) and _KERNELS is not None:
        path, num_accepted, bonus, new_tokens = _KERNELS.walk(
            tree.tokens, tree.parents, tree.depths, tree.valid, target_tokens, mask,
            tree.max_depth,
        )  # fmt: skip
        return WalkResult(path, num_accepted, bonus, new_tokens)
    bs, n = tree.tokens.shape
    dev = tree.tokens.device
    depths = tree.max_depth
    target = target_tokens.to(torch.long)
    wanted = target.gather(1, tree.parents.clamp(min=0))
    is_root = torch.arange(n, device=dev) == 0
    match = ((tree.tokens == wanted) & tree.valid) | is_root
    accepted = ~(mask & ~match.unsqueeze(1)).any(dim=2)  # [bs, N]
    num_accepted = accepted.sum(dim=1) - 1
    deepest = torch.where(accepted, tree.depths, -1).argmax(dim=1)
    bonus = target.gather(1, deepest.unsqueeze(1)).squeeze(1)

    # Scatter accepted slots to their depth; the rest land in a spare column that is dropped.
    column = torch.where(accepted, tree.depths, depths + 1)
    path = torch.full((bs, depths + 2), -1, dtype=torch.long, device=dev)
    path.scatter_(1, column, torch.arange(n, device=dev).expand(bs, n))
    path = path[:, : depths + 1]

    steps = torch.arange(depths + 1, device=dev).expand(bs, depths + 1)
    next_slot = torch.cat([path[:, 1:], torch.full((bs, 1), -1, device=dev)], 1)
    along = tree.tokens.gather(1, next_slot.clamp(min=0))
    n_acc = num_accepted.unsqueeze(1)
    new_tokens = torch.where(steps < n_acc, along, -1)
    new_tokens = torch.where(steps == n_acc, bonus.unsqueeze(1), new_tokens)
    return WalkResult(path=path, num_accepted=num_accepted, bonus=bonus, new_tokens=new_tokens)


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"
