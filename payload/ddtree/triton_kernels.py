"""Triton kernels for one DDTree round: vocabulary top-k, tree build, compile and walk.

The fast path of ``ddtree/core.py`` (shipped into SGLang as ``srt/speculative/ddtree_triton.py``).
It imports ``triton`` at module load, so importing it fails where Triton is missing and the core
falls back to its pure-torch path. Every wrapper takes and returns plain tensors (no dataclasses)
and launches one or two kernels with no host synchronisation, so a round can be captured in a
CUDA graph. With ``TRITON_INTERPRET=1`` set before import, the kernels also run on CPU tensors.

Sort keys. Candidates are ordered by packing them into one int64: the high 32 bits hold the
float32 score mapped to an order-preserving signed int32 (negative floats have their 31 low bits
flipped; -0.0 is first turned into +0.0 so that it ties with +0.0 as in torch), the low 32 bits
hold an index subtracted from its maximum, so a descending sort yields score descending, then
index ascending: exactly the stable descending ``torch.sort`` of the pure-torch path. Indices are
distinct, so the order is total and ``tl.topk`` (a bitonic top-k) reproduces it bit for bit.

* Build (one program per request): depth by depth, the ``B x K`` candidates (parent position
  major, rank minor) are reduced to the best ``B`` with ``tl.topk``; each survivor is kept as a
  global key (score, then flat index ``depth * B + position``, then its candidate index in the
  spare low bits); a last ``tl.topk`` over all ``D x B`` survivors gives the ``B`` slots in heap
  pop order, and a parent's slot is found by matching its flat index among the chosen.
* Compile (one program per request): the ancestor mask is the closure of ``I + P`` (P: parent
  adjacency) by repeated squaring with ``tl.dot`` on 0/1 fp16 tiles, clamped to 1 each step;
  the same number of doublings as the core's pointer jumping, hence the same mask.
* Walk (one program per request): accepted = slots whose ancestors all match their parent's
  target token; the path, bonus and new tokens are read off with one-hot reductions.
* Top-k (two kernels): per (row, vocabulary chunk) a max, a sum of exponentials and a top-k key
  list; then per row the log-sum-exp and the top-k of the chunk lists. Tokens and order match
  ``torch.topk(torch.log_softmax(x))`` up to ties; the log-probabilities equal torch's to within
  float rounding (the normaliser is summed in another order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = [
    "BUILD_MAX_ELEMENTS",
    "build",
    "build_supported",
    "compile_verify",
    "topk_logprobs",
    "walk",
]

BUILD_MAX_ELEMENTS = 4096  # largest padded B*K and D*B handled in registers by one program
_SENT = -9223372036854775807  # a key below every real key (real high parts are >= -2**31 + 1)
_IMAX = 2147483647


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _log2(n: int) -> int:
    return n.bit_length() - 1


@triton.jit
def _score_key(score):
    """float32 -> int64 whose signed order is the float order (high 32 bits set, low bits 0)."""
    s = tl.where(score == 0.0, 0.0, score)
    i = s.to(tl.int32, bitcast=True)
    o = tl.where(i < 0, i ^ 0x7FFFFFFF, i)
    return o.to(tl.int64) << 32


@triton.jit
def _key_score(key):
    o = (key >> 32).to(tl.int32)
    i = tl.where(o < 0, o ^ 0x7FFFFFFF, o)
    return i.to(tl.float32, bitcast=True)


@triton.jit
def _key_low(key):
    return key - ((key >> 32) << 32)


# --------------------------------------------------------------------------------- top-k


@triton.jit
def _topk_partial_kernel(
    x_ptr, stride_row, vocab, n_chunks, pmax_ptr, psum_ptr, pkey_ptr,
    CHUNK: tl.constexpr, KP: tl.constexpr, SENT: tl.constexpr, IMAX: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = offs < vocab
    x = tl.load(x_ptr + row * stride_row + offs, mask=inside, other=float("-inf")).to(tl.float32)
    cmax = tl.max(x, axis=0)
    e = tl.where(x == float("-inf"), 0.0, tl.exp(x - cmax))
    csum = tl.sum(e, axis=0)
    key = _score_key(x) | (IMAX - offs).to(tl.int64)
    key = tl.where(inside, key, SENT)
    top = tl.topk(key, KP)
    part = row * n_chunks + chunk
    tl.store(pmax_ptr + part, cmax)
    tl.store(psum_ptr + part, csum)
    tl.store(pkey_ptr + part * KP + tl.arange(0, KP), top)


@triton.jit
def _topk_final_kernel(
    pmax_ptr, psum_ptr, pkey_ptr, n_chunks, k, lp_ptr, tok_ptr,
    NCP: tl.constexpr, KP: tl.constexpr, SENT: tl.constexpr, IMAX: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    c = tl.arange(0, NCP)
    pmax = tl.load(pmax_ptr + row * n_chunks + c, mask=c < n_chunks, other=float("-inf"))
    psum = tl.load(psum_ptr + row * n_chunks + c, mask=c < n_chunks, other=0.0)
    big = tl.max(pmax, axis=0)
    total = tl.sum(tl.where(pmax == float("-inf"), 0.0, psum * tl.exp(pmax - big)), axis=0)
    logsum = tl.log(total)
    q = tl.arange(0, NCP * KP)
    keys = tl.load(pkey_ptr + row * n_chunks * KP + q, mask=q < n_chunks * KP, other=SENT)
    top = tl.topk(keys, KP)
    lp = (_key_score(top) - big) - logsum
    lp = tl.where(lp == 0.0, 0.0, lp)
    token = IMAX - _key_low(top)
    r = tl.arange(0, KP)
    tl.store(lp_ptr + row * k + r, lp, mask=r < k)
    tl.store(tok_ptr + row * k + r, token, mask=r < k)


def topk_logprobs(logits: Tensor, k: int, chunk: int = 4096) -> tuple[Tensor, Tensor]:
    """``logits [rows, V]`` -> (float32 log-probabilities, int64 tokens), both ``[rows, k]``."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    kp = _pow2(k)
    chunk = max(_pow2(min(chunk, vocab)), kp, 16)
    n_chunks = triton.cdiv(vocab, chunk)
    dev = logits.device
    pmax = torch.empty(rows * n_chunks, dtype=torch.float32, device=dev)
    psum = torch.empty(rows * n_chunks, dtype=torch.float32, device=dev)
    pkey = torch.empty(rows * n_chunks * kp, dtype=torch.int64, device=dev)
    lp = torch.empty(rows, k, dtype=torch.float32, device=dev)
    tok = torch.empty(rows, k, dtype=torch.int64, device=dev)
    if rows == 0:
        return lp, tok
    _topk_partial_kernel[(rows, n_chunks)](
        logits, logits.stride(0), vocab, n_chunks, pmax, psum, pkey,
        CHUNK=chunk, KP=kp, SENT=_SENT, IMAX=_IMAX, num_warps=4 if chunk <= 4096 else 8,
    )  # fmt: skip
    _topk_final_kernel[(rows,)](
        pmax, psum, pkey, n_chunks, k, lp, tok,
        NCP=_pow2(n_chunks), KP=kp, SENT=_SENT, IMAX=_IMAX, num_warps=4,
    )  # fmt: skip
    return lp, tok


# ---------------------------------------------------------------------------------- build


@triton.jit
def _build_kernel(
    lp_ptr, tok_ptr, root_ptr,
    tokens_ptr, parents_ptr, depths_ptr, ranks_ptr, scores_ptr, valid_ptr,
    D: tl.constexpr, B: tl.constexpr, K: tl.constexpr,
    BP: tl.constexpr, KP: tl.constexpr, DP: tl.constexpr, CBITS: tl.constexpr, SENT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    n = B + 1
    p = tl.arange(0, BP)  # position within a depth's level (parent position for candidates)
    r = tl.arange(0, KP)
    dd = tl.arange(0, DP)
    cand = p[:, None] * KP + r[None, :]  # (position, rank) order = the core's candidate order
    cand_ok = (p[:, None] < B) & (r[None, :] < K)
    CMAX: tl.constexpr = BP * KP - 1
    FMAX: tl.constexpr = DP * BP - 1
    level = tl.where(p == 0, 0.0, float("-inf"))
    surv = tl.full([DP, BP], SENT, tl.int64)
    for d in range(D):
        row = (b * D + d) * K
        lpd = tl.load(lp_ptr + row + r, mask=r < K, other=float("-inf"))
        score = level[:, None] + lpd[None, :]
        key = _score_key(score) | (CMAX - cand).to(tl.int64)
        key = tl.where(cand_ok, key, SENT)
        top = tl.topk(tl.reshape(key, [BP * KP]), BP)  # the best B, best first
        level = tl.where(p < B, _key_score(top), float("-inf"))
        flat = d * BP + p
        ckey = CMAX - _key_low(top)
        gkey = ((top >> 32) << 32) | ((FMAX - flat).to(tl.int64) << CBITS) | ckey
        gkey = tl.where(p < B, gkey, SENT)
        surv = tl.where(dd[:, None] == d, gkey[None, :], surv)
    chosen = tl.topk(tl.reshape(surv, [DP * BP]), BP)  # heap pop order
    score = _key_score(chosen)
    low = _key_low(chosen)
    flat = FMAX - (low >> CBITS)
    ckey = low - ((low >> CBITS) << CBITS)
    depth0 = flat // BP
    parent_pos = ckey // KP
    rank = ckey - parent_pos * KP
    live = p < B
    valid = (score > float("-inf")) & live
    token = tl.load(tok_ptr + (b * D + depth0) * K + rank, mask=valid, other=-1)
    parent_flat = (depth0 - 1) * BP + parent_pos
    same = (flat[None, :] == parent_flat[:, None]) & live[None, :]
    parent = tl.sum(tl.where(same, p[None, :] + 1, 0), axis=1)
    parent = tl.where(depth0 == 0, 0, parent)
    out = b * n + 1 + p
    tl.store(tokens_ptr + out, tl.where(valid, token, -1), mask=live)
    tl.store(parents_ptr + out, tl.where(valid, parent, 0).to(tl.int64), mask=live)
    tl.store(depths_ptr + out, tl.where(valid, depth0 + 1, 1).to(tl.int64), mask=live)
    tl.store(ranks_ptr + out, tl.where(valid, rank, 0).to(tl.int64), mask=live)
    tl.store(scores_ptr + out, tl.where(valid, score, float("-inf")), mask=live)
    tl.store(valid_ptr + out, valid.to(tl.uint8), mask=live)
    # The root, slot 0.
    two = tl.arange(0, 2)
    first = two == 0
    root = tl.load(root_ptr + b + two * 0).to(tl.int64)
    zero = tl.zeros([2], tl.int64)
    tl.store(tokens_ptr + b * n + two, root, mask=first)
    tl.store(parents_ptr + b * n + two, zero - 1, mask=first)
    tl.store(depths_ptr + b * n + two, zero, mask=first)
    tl.store(ranks_ptr + b * n + two, zero, mask=first)
    tl.store(scores_ptr + b * n + two, zero.to(tl.float32), mask=first)
    tl.store(valid_ptr + b * n + two, (zero + 1).to(tl.uint8), mask=first)


def _build_sizes(depths: int, k: int, budget: int) -> tuple[int, int, int, int]:
    bp, kp, dp = _pow2(budget), _pow2(k), _pow2(depths)
    return bp, kp, dp, _log2(bp * kp)


def build_supported(depths: int, k: int, budget: int) -> bool:
    """Whether :func:`build` handles these sizes (registers of one program, 32-bit key room)."""
    bp, kp, dp, cbits = _build_sizes(depths, k, budget)
    return (
        bp * kp <= BUILD_MAX_ELEMENTS
        and dp * bp <= BUILD_MAX_ELEMENTS
        and (cbits + _log2(dp * bp) <= 32)
    )


def build(lp: Tensor, tok: Tensor, roots: Tensor, budget: int) -> tuple[Tensor, ...]:
    """``lp``/``tok [bs, D, K]``, ``roots [bs]`` -> tokens, parents, depths, ranks (int64),
    scores (float32), valid (bool), each ``[bs, budget + 1]`` (the core's ``DDTree`` fields)."""
    bs, depths, k = lp.shape
    bp, kp, dp, cbits = _build_sizes(depths, k, budget)
    lp = lp.to(torch.float32).contiguous()
    tok = tok.to(torch.int64).contiguous()
    roots = roots.contiguous()
    dev = lp.device
    n = budget + 1
    outs = [torch.empty(bs, n, dtype=torch.int64, device=dev) for _ in range(4)]
    scores = torch.empty(bs, n, dtype=torch.float32, device=dev)
    valid = torch.empty(bs, n, dtype=torch.uint8, device=dev)
    if bs:
        warps = 4 if bp * kp <= 1024 and dp * bp <= 1024 else 8
        _build_kernel[(bs,)](
            lp, tok, roots, *outs, scores, valid,
            D=depths, B=budget, K=k, BP=bp, KP=kp, DP=dp, CBITS=cbits, SENT=_SENT, num_warps=warps,
        )  # fmt: skip
    return (*outs, scores, valid.view(torch.bool))


# -------------------------------------------------------------------------------- compile


@triton.jit
def _compile_kernel(
    parents_ptr, tokens_ptr, depths_ptr, start_ptr, n, pad,
    ids_ptr, pos_ptr, mask_ptr, add_ptr,
    STEPS: tl.constexpr, NP: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    i = tl.arange(0, NP)
    inside = i < n
    parent = tl.load(parents_ptr + b * n + i, mask=inside, other=0)
    parent = tl.maximum(parent, 0)
    adj = (i[None, :] == i[:, None]) | (i[None, :] == parent[:, None])
    m = (adj & inside[:, None]).to(tl.float16)
    for _ in tl.static_range(STEPS):  # each squaring doubles the covered distance
        m = tl.minimum(tl.dot(m, m, out_dtype=tl.float32), 1.0).to(tl.float16)
    allowed = m > 0
    both = inside[:, None] & inside[None, :]
    cell = b * n * n + i[:, None] * n + i[None, :]
    tl.store(mask_ptr + cell, allowed.to(tl.uint8), mask=both)
    additive = tl.where(allowed, 0.0, float("-inf"))
    tl.store(add_ptr + cell, additive.to(add_ptr.dtype.element_ty), mask=both)
    token = tl.load(tokens_ptr + b * n + i, mask=inside, other=0)
    tl.store(ids_ptr + b * n + i, tl.where(token >= 0, token, pad), mask=inside)
    start = tl.load(start_ptr + b + i * 0).to(tl.int64)
    depth = tl.load(depths_ptr + b * n + i, mask=inside, other=0)
    tl.store(pos_ptr + b * n + i, start + depth, mask=inside)


def compile_verify(
    parents: Tensor,
    tokens: Tensor,
    depths: Tensor,
    start: Tensor,
    max_depth: int,
    pad_token_id: int,
    mask_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> input_ids, positions, bool mask, additive mask (the core's ``VerifyInputs`` fields)."""
    bs, n = parents.shape
    dev = parents.device
    steps, reach = 0, 1
    while reach < max_depth:
        reach *= 2
        steps += 1
    ids = torch.empty(bs, n, dtype=torch.int64, device=dev)
    pos = torch.empty(bs, n, dtype=torch.int64, device=dev)
    mask = torch.empty(bs, n, n, dtype=torch.uint8, device=dev)
    additive = torch.empty(bs, n, n, dtype=mask_dtype, device=dev)
    if bs:
        np_ = max(16, _pow2(n))
        _compile_kernel[(bs,)](
            parents.contiguous(), tokens.contiguous(), depths.contiguous(), start.contiguous(),
            n, pad_token_id, ids, pos, mask, additive,
            STEPS=steps, NP=np_, num_warps=4 if np_ <= 64 else 8,
        )  # fmt: skip
    return ids, pos, mask.view(torch.bool), additive


# ----------------------------------------------------------------------------------- walk


@triton.jit
def _walk_kernel(
    tokens_ptr, parents_ptr, depths_ptr, valid_ptr, target_ptr, target_stride,
    mask_ptr, sm0, sm1, sm2, n, depths_total,
    path_ptr, nacc_ptr, bonus_ptr, new_ptr,
    NP: tl.constexpr, LP: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    i = tl.arange(0, NP)
    inside = i < n
    token = tl.load(tokens_ptr + b * n + i, mask=inside, other=-1)
    parent = tl.maximum(tl.load(parents_ptr + b * n + i, mask=inside, other=0), 0)
    depth = tl.load(depths_ptr + b * n + i, mask=inside, other=0)
    valid = tl.load(valid_ptr + b * n + i, mask=inside, other=0) != 0
    wanted = tl.load(target_ptr + b * target_stride + parent, mask=inside, other=0).to(tl.int64)
    match = ((token == wanted) & valid) | (i == 0)
    both = inside[:, None] & inside[None, :]
    mk = tl.load(mask_ptr + b * sm0 + i[:, None] * sm1 + i[None, :] * sm2, mask=both, other=0)
    bad = ((mk != 0) & ~match[None, :]).to(tl.int32)
    accepted = (tl.max(bad, axis=1) == 0) & inside
    nacc = tl.sum(accepted.to(tl.int64), axis=0) - 1
    adepth = tl.where(accepted, depth, -1)
    deepest = tl.min(tl.where(adepth == tl.max(adepth, axis=0), i, NP), axis=0)
    bonus = tl.load(target_ptr + b * target_stride + deepest).to(tl.int64)
    k = tl.arange(0, LP)
    at = accepted[None, :] & (depth[None, :] == k[:, None])
    path = tl.max(tl.where(at, i[None, :], -1), axis=1).to(tl.int64)
    nxt = accepted[None, :] & (depth[None, :] == k[:, None] + 1)
    next_slot = tl.maximum(tl.max(tl.where(nxt, i[None, :], -1), axis=1), 0)
    along = tl.load(tokens_ptr + b * n + next_slot)
    new = tl.where(k < nacc, along, -1)
    new = tl.where(k == nacc, bonus, new)
    width = depths_total + 1
    keep = k < width
    tl.store(path_ptr + b * width + k, path, mask=keep)
    tl.store(new_ptr + b * width + k, new, mask=keep)
    first = k == 0
    tl.store(nacc_ptr + b + k * 0, nacc + k * 0, mask=first)
    tl.store(bonus_ptr + b + k * 0, bonus + k * 0, mask=first)


def walk(
    tokens: Tensor,
    parents: Tensor,
    depths: Tensor,
    valid: Tensor,
    target: Tensor,
    mask: Tensor,
    max_depth: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> path, num_accepted, bonus, new_tokens (the core's ``WalkResult`` fields)."""
    bs, n = tokens.shape
    dev = tokens.device
    path = torch.empty(bs, max_depth + 1, dtype=torch.int64, device=dev)
    new = torch.empty(bs, max_depth + 1, dtype=torch.int64, device=dev)
    nacc = torch.empty(bs, dtype=torch.int64, device=dev)
    bonus = torch.empty(bs, dtype=torch.int64, device=dev)
    if bs:
        if target.stride(1) != 1:
            target = target.contiguous()
        mask_u8 = (
            mask.view(torch.uint8) if mask.dtype == torch.bool else (mask != 0).to(torch.uint8)
        )
        np_ = max(16, _pow2(n))
        _walk_kernel[(bs,)](
            tokens.contiguous(), parents.contiguous(), depths.contiguous(),
            valid.contiguous().view(torch.uint8), target, target.stride(0),
            mask_u8, *mask_u8.stride(), n, max_depth,
            path, nacc, bonus, new,
            NP=np_, LP=_pow2(max_depth + 2), num_warps=4 if np_ <= 64 else 8,
        )  # fmt: skip
    return path, nacc, bonus, new
