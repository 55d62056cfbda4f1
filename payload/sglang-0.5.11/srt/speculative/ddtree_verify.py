"""The DDTree verify round for SGLang, engine-agnostic: plan, target pass, walk, KV keep.

A round turns the drafter's per-depth top-k into the tree to verify (DDTree's best-first tree in
full-tree mode; the drafter's top-1 chain, which is what DFlash verifies, in shadow-linear mode,
where the full tree is still built and scored), compiles the verify inputs, takes the target's
token after every slot, walks the tree and says which verify-block slots to keep, in path order.

Everything here is batched torch with shapes fixed by (batch, budget, depths, top-k); nothing
reads device values on the host (``block_order`` takes host-side lists; ``custom_mask_index``
places the tree's mask in SGLang's flattened layout from the device's lengths), so a round's
plan and its walk can be replayed from CUDA graphs (``ddtree_graphs``). Imports: torch and the
DDTree core only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from sglang.srt.speculative.ddtree_core import (
    DDTree,
    VerifyInputs,
    WalkResult,
    build_tree,
    compile_tree,
    draft_topk,
    walk_tree,
)

TargetFn = Callable[[VerifyInputs], Tensor]
"""Runs the target over a verify block; returns its token after every slot, ``[bs, N]``."""


@dataclass(frozen=True)
class TreeRound:
    """A planned round: the tree that is verified, its inputs and the scored full tree.

    The draft-expected accepts are diagnostics, computed when read (no kernels otherwise).
    """

    tree: DDTree  # verified: the DDTree (full-tree) or the top-1 chain (shadow-linear)
    inputs: VerifyInputs
    scored: DDTree  # the full DDTree, built and scored in both modes
    chain: DDTree | None  # the top-1 chain, if built (shadow-linear, or score_chain)
    shadow_linear: bool

    @property
    def width(self) -> int:
        """Verify-block width N (tokens per request in the target pass)."""
        return int(self.tree.tokens.shape[1])

    @property
    def expected_accept(self) -> Tensor:
        """[bs] float32: draft-expected accepted tokens of the scored tree."""
        return expected_accept(self.scored)

    @property
    def chain_expected_accept(self) -> Tensor | None:
        """[bs] float32: the same for the top-1 chain; None where the chain was not built."""
        return None if self.chain is None else expected_accept(self.chain)


@dataclass(frozen=True)
class RoundResult:
    """A walked round. ``keep_slots[b, :commit_lens[b]]`` are the slots whose KV is kept."""

    walk: WalkResult
    keep_slots: Tensor  # [bs, D + 1] verify-block slots along the accepted path, root first, -1 pad
    new_tokens: Tensor  # [bs, D + 1] accepted draft tokens then the bonus, -1 pad

    @property
    def commit_lens(self) -> Tensor:
        """[bs] int64: accepted drafts + 1 (root + accepted draft tokens); computed when read."""
        return self.walk.num_accepted + 1


def chain_tree(top_logprobs: Tensor, top_tokens: Tensor, root_tokens: Tensor) -> DDTree:
    """The drafter's top-1 chain as a tree (slot d = depth d), i.e. DFlash's verify block."""
    depths = top_logprobs.shape[1]
    return build_tree(top_logprobs[..., :1], top_tokens[..., :1], root_tokens, depths)


def expected_accept(tree: DDTree) -> Tensor:
    """Expected accepted draft tokens if the target followed the drafter: sum of path probs."""
    probs = torch.where(tree.valid, tree.scores.exp(), 0.0)
    return probs[:, 1:].sum(dim=1)


def plan_round(
    top_logprobs: Tensor,
    top_tokens: Tensor,
    root_tokens: Tensor,
    start_positions: Tensor,
    *,
    budget: int,
    shadow_linear: bool = False,
    score_chain: bool = True,
    pad_token_id: int = 0,
) -> TreeRound:
    """Build (and in shadow-linear mode also score) the tree, then compile its verify inputs.

    ``score_chain=False`` skips building and scoring DFlash's chain beside the tree in full-tree
    mode (``chain_expected_accept`` is then None); shadow-linear mode always builds the chain.

    ``top_logprobs/top_tokens [bs, D, K]`` from :func:`draft_topk`; ``root_tokens [bs]`` the
    previous bonus tokens; ``start_positions [bs]`` the root's position (the committed length).
    """
    scored = build_tree(top_logprobs, top_tokens, root_tokens, budget)
    chain = (
        chain_tree(top_logprobs, top_tokens, root_tokens)
        if shadow_linear or score_chain
        else None
    )
    tree = chain if shadow_linear and chain is not None else scored
    inputs = compile_tree(tree, start_positions, pad_token_id=pad_token_id)
    return TreeRound(
        tree=tree, inputs=inputs, scored=scored, chain=chain, shadow_linear=shadow_linear
    )


def finish_round(plan: TreeRound, target_tokens: Tensor) -> RoundResult:
    """Walk the verified tree with the target's per-slot tokens ``[bs, N]``."""
    walk = walk_tree(plan.tree, target_tokens, plan.inputs.mask)
    return RoundResult(walk=walk, keep_slots=walk.path, new_tokens=walk.new_tokens)


def finish_and_pack(plan: TreeRound, target_tokens: Tensor) -> tuple[RoundResult, Tensor]:
    """:func:`finish_round`, and what the host reads of it as one ``[bs, 2 (D + 1) + 1]`` tensor:
    per request the new tokens, the accepted path's slots, then the accept count."""
    result = finish_round(plan, target_tokens)
    packed = torch.cat(
        [result.new_tokens, result.keep_slots, result.walk.num_accepted.unsqueeze(1)], 1
    )
    return result, packed


def verify_round(
    draft_logits: Tensor,
    root_tokens: Tensor,
    start_positions: Tensor,
    target: TargetFn,
    *,
    budget: int,
    top_k: int | None = None,
    shadow_linear: bool = False,
    pad_token_id: int = 0,
) -> tuple[TreeRound, RoundResult]:
    """One whole round from the drafter's logits ``[bs, D, V]``: plan, target pass, walk."""
    k = budget if top_k is None else top_k
    top_logprobs, top_tokens = draft_topk(draft_logits, k)
    plan = plan_round(
        top_logprobs,
        top_tokens,
        root_tokens,
        start_positions,
        budget=budget,
        shadow_linear=shadow_linear,
        pad_token_id=pad_token_id,
    )
    target_tokens = target(plan.inputs)
    if target_tokens.shape != plan.tree.tokens.shape:
        raise ValueError(
            f"target returned {list(target_tokens.shape)}, expected {list(plan.tree.tokens.shape)}"
        )
    return plan, finish_round(plan, target_tokens)


def keep_mask(keep_slots: Tensor, commit_lens: Tensor, width: int) -> Tensor:
    """``[bs, width]`` bool: True for the verify-block slots whose KV entries are kept."""
    bs, steps = keep_slots.shape
    along = torch.arange(steps, device=keep_slots.device).expand(bs, steps)
    live = along < commit_lens.to(keep_slots.device).unsqueeze(1)
    column = torch.where(live & (keep_slots >= 0), keep_slots, width)
    out = torch.zeros(bs, width + 1, dtype=torch.bool, device=keep_slots.device)
    out.scatter_(1, column, True)
    return out[:, :width]


def select_first(values: Tensor, keep: Tensor, count: int) -> Tensor:
    """The ``count`` entries of ``values`` where ``keep`` is True, in order, without a sync.

    ``count`` must be the number of True entries, known on the host (e.g. from committed lengths).
    """
    flat_keep = keep.reshape(-1)
    order = torch.argsort((~flat_keep).to(torch.int8), stable=True)
    return values.reshape(-1, *values.shape[keep.dim() :])[order[:count]]


def block_order(paths: list[list[int]], commit_lens: list[int], width: int) -> list[int]:
    """Host-side order of a verify block's ``bs * width`` flat slots: per request the first
    ``commit_lens[b]`` slots of its accepted path (``paths[b]``, root first), then every other
    slot of every request in slot order. So ``order[:sum(commit_lens)]`` are the slots whose KV
    is kept, in path order, and the rest are the slots to free: what :func:`keep_mask` and
    :func:`select_first` give on the device, computed from the lists the host already holds.
    """
    kept: list[int] = []
    freed: list[int] = []
    for b, (path, length) in enumerate(zip(paths, commit_lens, strict=True)):
        base = b * width
        taken = path[:length]
        kept.extend(base + slot for slot in taken)
        skip = set(taken)
        freed.extend(base + slot for slot in range(width) if slot not in skip)
    return kept + freed


def custom_mask_index(prefix_lens: Tensor, n: int) -> Tensor:
    """``[bs * n * n]`` int64: where tree cell (request b, row i, column j) sits in SGLang's
    flattened verify mask (per request, n rows of the committed prefix then the n tree slots).

    ``prefix_lens [bs]`` are the committed lengths on the mask's device; no host read, so this
    can run inside the round's plan graph.
    """
    lens = prefix_lens.to(torch.long)
    row_len = lens + n
    cells = row_len * n
    start = torch.cumsum(cells, 0) - cells  # first cell of request b
    i = torch.arange(n, device=lens.device)
    rows = (start + lens).unsqueeze(1) + i.unsqueeze(0) * row_len.unsqueeze(1)  # [bs, n]
    return (rows.unsqueeze(2) + i.view(1, 1, n)).reshape(-1)


def tree_custom_mask(
    mask: Tensor, prefix_lens: Tensor, total: int, index: Tensor | None = None
) -> Tensor:
    """SGLang's flattened verify mask for a tree: per request, rows = the N tree slots, columns =
    the committed prefix then the N tree slots; True = may attend. ``total`` is
    ``sum(N * (prefix_len + N))`` (known on the host). ``index`` is :func:`custom_mask_index`
    of the lengths where the caller has it (the round's plan graph computes it on the device);
    without it the row offsets are computed here from ``prefix_lens``, host-side lengths
    (``seq_lens_cpu``), and go to the device in one non-blocking copy: fewer kernels than the
    device index when nothing is replayed from a graph.
    """
    bs, n, _ = mask.shape
    dev = mask.device
    if index is None:
        offsets: list[int] = []  # flat index of (request b, row i, tree column 0)
        start = 0
        for length in prefix_lens.tolist():
            row_len = int(length) + n
            offsets.extend(start + int(length) + i * row_len for i in range(n))
            start += n * row_len
        # pinned and non-blocking: no host wait for the stream (as ddtree_staging.to_device)
        host = torch.tensor(offsets, dtype=torch.long, pin_memory=dev.type == "cuda")
        rows = host.to(dev, non_blocking=True).view(bs, n, 1)
        index = (rows + torch.arange(n, device=dev).view(1, 1, n)).reshape(-1)
    flat = torch.ones(total, dtype=torch.bool, device=dev)
    flat.scatter_(0, index, mask.reshape(-1))
    return flat
