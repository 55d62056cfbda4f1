"""The verify pass's attention for a tree (or chain) block, as a split-KV Triton kernel.

SGLang's Triton backend runs a speculative verify through its extend kernel: one program per
(request, query head, 128 query rows) walks the whole prefix. A verify block has N (16 or 32)
queries a request, so 7/8 (or 3/4) of each tile's rows are padding, every query head of a KV
group loads the same K and V again, and at batch 1 there are 32 programs for 132 SMs, each
walking the prefix alone: ~1.8 ms a target pass on an 8B-shaped model against ~0.33 ms for a
decode step's attention (issue 28's profile).

:func:`tree_verify_attention` computes the same thing with the same arguments: one program per
(request, KV head, split) holds the G query heads of that KV group times the N queries as its
rows (no padding at N x G >= 16); the prefix is split over ``splits - 1`` programs (every prefix
column is visible to every query) and the block's own N columns are the last split's, under the
tree mask read from SGLang's flattened mask (per request N rows of prefix + N columns,
``mask_indptr``); a second kernel merges the splits' partial softmaxes. Shapes, and so a CUDA
graph's launches, depend only on (batch, N, heads): the split count comes from the batch size.

:func:`wrap` puts it in front of SGLang's extend kernel for the calls it serves (a custom mask,
every request N queries, no sliding window, sinks or logit cap) and checks it once against that
kernel on the first such call outside graph capture: a mismatch or an error turns it off for the
process (the extend kernel serves as before); ``SGLANG_DDTREE_TREE_ATTENTION=0`` leaves it
off (for an A/B in one run). Imports: torch, triton.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)

TARGET_PROGRAMS = 264  # about two waves of an H200's 132 SMs
MAX_SPLITS = 16


@triton.jit
def _tree_split_kernel(
    Q, K_ext, V_ext, K_buf, V_buf, qo_indptr, kv_indptr, kv_indices, mask_ptr, mask_indptr,
    Mid_O, Mid_L, sm_scale, k_scale, v_scale,
    stride_qbs, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh,
    stride_bkbs, stride_bkh, stride_bvbs, stride_bvh,
    stride_mo_t, stride_mo_h, stride_mo_s, stride_ml_t, stride_ml_h,
    N: tl.constexpr, G: tl.constexpr, SPLITS: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.arange(0, BLOCK_R)
    g = rows // N
    i = rows % N
    row_ok = rows < G * N
    head = kvh * G + g
    q_start = tl.load(qo_indptr + b)
    kv_start = tl.load(kv_indptr + b)
    prefix = tl.load(kv_indptr + b + 1) - kv_start
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(Q + (q_start + i)[:, None] * stride_qbs + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    if split < SPLITS - 1:
        chunk = tl.cdiv(tl.cdiv(prefix, SPLITS - 1), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(lo + chunk, prefix)
        for start in range(lo, hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < hi
            loc = tl.load(kv_indices + kv_start + cols, mask=col_ok, other=0).to(tl.int64)
            k = tl.load(K_buf + loc[:, None] * stride_bkbs + kvh * stride_bkh + d[None, :],
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            s = tl.dot(q, tl.trans(k.to(q.dtype))).to(tl.float32) * (sm_scale * k_scale)
            s = tl.where(col_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m - m_safe)
            v = tl.load(V_buf + loc[:, None] * stride_bvbs + kvh * stride_bvh + d[None, :],
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype)).to(tl.float32) \
                * v_scale
            l_sum = l_sum * alpha + tl.sum(p, 1)
            m = m_new
    else:  # the block's own columns (names apart from the loop's: one type per name)
        tcols = tl.arange(0, BLOCK_T)
        t_ok = tcols < N
        kt = tl.load(K_ext + (q_start + tcols)[:, None] * stride_kbs + kvh * stride_kh
                     + d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        st = tl.dot(q, tl.trans(kt.to(q.dtype))).to(tl.float32) * sm_scale
        mstart = tl.load(mask_indptr + b)
        allowed = tl.load(mask_ptr + mstart + i[:, None] * (prefix + N) + prefix + tcols[None, :],
                          mask=row_ok[:, None] & t_ok[None, :], other=0)
        st = tl.where((allowed != 0) & t_ok[None, :], st, float("-inf"))
        m = tl.max(st, 1)
        mt = tl.where(m == float("-inf"), 0.0, m)
        pt = tl.exp(st - mt[:, None])
        vt = tl.load(V_ext + (q_start + tcols)[:, None] * stride_vbs + kvh * stride_vh
                     + d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        acc = tl.dot(pt.to(q.dtype), vt.to(q.dtype)).to(tl.float32)
        l_sum = tl.sum(pt, 1)
    lse = tl.where(l_sum > 0, m + tl.log(tl.where(l_sum > 0, l_sum, 1.0)), float("-inf"))
    out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    t = q_start + i
    tl.store(Mid_O + t[:, None] * stride_mo_t + head[:, None] * stride_mo_h
             + split * stride_mo_s + d[None, :], out, mask=row_ok[:, None] & d_ok[None, :])
    tl.store(Mid_L + t * stride_ml_t + head * stride_ml_h + split, lse, mask=row_ok)


@triton.jit
def _tree_merge_kernel(
    Mid_O, Mid_L, Out, stride_mo_t, stride_mo_h, stride_mo_s, stride_ml_t, stride_ml_h,
    stride_ot, stride_oh, SPLITS: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < SPLITS
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    lse = tl.load(Mid_L + t * stride_ml_t + h * stride_ml_h + s, mask=s_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    w = tl.where(s_ok & (lse > float("-inf")), tl.exp(lse - top), 0.0)
    part = tl.load(Mid_O + t * stride_mo_t + h * stride_mo_h + s[:, None] * stride_mo_s
                   + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    den = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(Out + t * stride_ot + h * stride_oh + d, out.to(Out.dtype.element_ty), mask=d_ok)


def split_count(batch: int, kv_heads: int) -> int:
    """Splits a request's KV goes in (the last is the block's own columns), from the batch."""
    prefix_splits = max(1, min(MAX_SPLITS - 1, TARGET_PROGRAMS // max(1, batch * kv_heads)))
    return prefix_splits + 1


def tree_verify_attention(q: torch.Tensor, k_ext: torch.Tensor, v_ext: torch.Tensor,
                          o: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                          qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                          kv_indices: torch.Tensor, custom_mask: torch.Tensor,
                          mask_indptr: torch.Tensor, n: int, k_scale: float = 1.0,
                          v_scale: float = 1.0, sm_scale: float | None = None) -> None:
    """Attention of a verify block (``n`` queries a request) into ``o``; see the module.

    ``q [bs * n, H, D]``, ``k_ext``/``v_ext [bs * n, Hkv, D]`` (the block's own K and V),
    ``k_buf``/``v_buf`` the KV pool (``[slots, Hkv, D]``), ``kv_indptr [bs + 1]`` and
    ``kv_indices`` the prefix's slots, ``custom_mask`` SGLang's flattened bool mask and
    ``mask_indptr [bs + 1]`` where each request's starts."""
    bs = int(qo_indptr.shape[0]) - 1
    heads, d = int(q.shape[1]), int(q.shape[2])
    kv_heads = int(k_ext.shape[1])
    group = heads // kv_heads
    splits = split_count(bs, kv_heads)
    scale = float(sm_scale) if sm_scale else 1.0 / (d ** 0.5)
    tokens = bs * n
    mid_o = torch.empty((tokens, heads, splits, d), dtype=torch.float32, device=q.device)
    mid_l = torch.empty((tokens, heads, splits), dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(d)
    block_r = max(16, triton.next_power_of_2(group * n))
    block_t = max(16, triton.next_power_of_2(n))
    _tree_split_kernel[(bs, kv_heads, splits)](
        q, k_ext, v_ext, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, custom_mask,
        mask_indptr, mid_o, mid_l, scale, float(k_scale), float(v_scale),
        q.stride(0), q.stride(1), k_ext.stride(0), k_ext.stride(1), v_ext.stride(0),
        v_ext.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_l.stride(0), mid_l.stride(1),
        N=n, G=group, SPLITS=splits, D=d, BLOCK_D=block_d, BLOCK_R=block_r, BLOCK_N=64,
        BLOCK_T=block_t, num_warps=8 if block_r >= 128 else 4, num_stages=2)
    _tree_merge_kernel[(tokens, heads)](
        mid_o, mid_l, o, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_l.stride(0),
        mid_l.stride(1), o.stride(0), o.stride(1), SPLITS=splits, D=d, BLOCK_D=block_d,
        BLOCK_S=max(2, triton.next_power_of_2(splits)), num_warps=4)


def _served(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """N when SGLang's extend-kernel call is a verify block this kernel serves, else None."""
    custom_mask, mask_indptr, max_len = args[9], args[11], args[12]
    q, qo_indptr = args[0], args[6]
    if custom_mask is None or mask_indptr is None or not isinstance(max_len, int) or max_len <= 0:
        return None
    if kwargs.get("sliding_window_size", -1) not in (-1, None) \
            or kwargs.get("sinks") is not None or kwargs.get("logit_cap", 0.0) \
            or kwargs.get("xai_temperature_len", -1) not in (-1, None) \
            or kwargs.get("window_kv_offsets") is not None or len(args) > 16:
        return None
    # keywords of later SGLang releases (0.5.17's triton backend passes page_size, score_mod
    # and aux_tensors; 0.5.11 passes none of these): served only at what this kernel computes
    if kwargs.get("score_mod") is not None or kwargs.get("aux_tensors") is not None \
            or kwargs.get("lse_extend") is not None or kwargs.get("skip_prefix") \
            or kwargs.get("skip_extend") or kwargs.get("page_size", 1) not in (1, None) \
            or kwargs.get("skip_prefix_custom_mask", True) is not True:
        return None
    if q.shape[0] != (qo_indptr.shape[0] - 1) * max_len or q.shape[-1] != args[4].shape[-1]:
        return None
    if custom_mask.dtype not in (torch.bool, torch.uint8) or q.shape[1] % args[1].shape[1]:
        return None
    return max_len


def wrap(extend_fwd: Callable[..., Any], on: bool | None = None) -> Callable[..., Any]:
    """SGLang's ``extend_attention_fwd`` with verify blocks served by :func:`tree_verify_attention`
    (checked against ``extend_fwd`` on the first one outside graph capture; see the module).
    ``on``: the caller's switch (the plugin's settings decided it); None reads the environment."""
    # SGLANG_DDTREE_TREE_ATTENTION=0: SGLang's kernel throughout (an A/B switch, not a setting)
    if on is None:
        on = os.environ.get("SGLANG_DDTREE_TREE_ATTENTION", "1") not in ("0", "")
    state: dict[str, Any] = {"on": on, "checked": not on}

    def run_tree(args: tuple[Any, ...], kwargs: dict[str, Any], n: int) -> None:
        q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask = args[:10]
        k_scale, v_scale = args[13], args[14]
        sm_scale = args[15] if len(args) > 15 else kwargs.get("sm_scale")
        tree_verify_attention(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr,
                              kv_indices, mask, args[11], n, k_scale=k_scale, v_scale=v_scale,
                              sm_scale=sm_scale)

    def check(args: tuple[Any, ...], kwargs: dict[str, Any], n: int) -> None:
        state["checked"] = True
        o = args[3]
        try:
            extend_fwd(*args, **kwargs)
            want = o.float().clone()
            run_tree(args, kwargs, n)
            err = float((o.float() - want).abs().max())
            ok = err <= 2e-2 * max(1.0, float(want.abs().max()))
        except Exception as exc:  # the extend kernel serves from now on
            state["on"], why = False, f"{type(exc).__name__}: {exc}"
        else:
            state["on"], why = ok, f"max |diff| {err:.3g} against the extend kernel"
        logger.info("DDTREE tree verify attention %s (%s)", "on" if state["on"] else "off", why)

    def fwd(*args: Any, **kwargs: Any) -> Any:
        n = _served(args, kwargs) if state["on"] else None
        if n is None:
            return extend_fwd(*args, **kwargs)
        capturing = args[0].is_cuda and torch.cuda.is_current_stream_capturing()
        if not state["checked"] and not capturing:
            check(args, kwargs, n)
            if not state["on"]:
                return extend_fwd(*args, **kwargs)
            return None
        run_tree(args, kwargs, n)
        return None

    fwd.ddtree_state = state  # type: ignore[attr-defined]
    return fwd


def self_check(fwd: Callable[..., Any], *, device: torch.device | str, heads: int,
               kv_heads: int, head_dim: int, n: int, dtype: torch.dtype = torch.bfloat16,
               prefix_lens: tuple[int, ...] = (37, 300), seed: int = 0) -> str:
    """Make :func:`wrap`'s one check now, on a synthetic verify block of this model's shape
    (``n`` queries a request, a random ancestor-style mask), outside graph capture.

    For a caller whose first real verify block comes from a CUDA graph's warm-up, where the
    mask is a placeholder. Returns ``"on"`` or ``"off"`` (the check's verdict, logged with the
    difference found; ``"off"`` too where ``SGLANG_DDTREE_TREE_ATTENTION=0`` keeps the kernel
    off), or ``"checked"`` when the check ran before."""
    state = getattr(fwd, "ddtree_state", None)
    if state is None or not state["on"]:
        return "off"
    if state["checked"]:
        return "checked"
    gen = torch.Generator().manual_seed(seed)
    bs, total = len(prefix_lens), sum(prefix_lens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    def ints(values: list[int], dt: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.tensor(values, dtype=dt).to(device)

    q, k_ext, v_ext = rand(bs * n, heads, head_dim), rand(bs * n, kv_heads, head_dim), \
        rand(bs * n, kv_heads, head_dim)
    k_buf, v_buf = rand(total + 8, kv_heads, head_dim), rand(total + 8, kv_heads, head_dim)
    kv_indices = torch.randperm(total + 8, generator=gen)[:total].to(device)
    rows: list[torch.Tensor] = []
    for p in prefix_lens:  # per request n rows of (prefix + n) columns, SGLang's layout
        block = torch.tril(torch.rand(n, n, generator=gen) < 0.5) | torch.eye(n, dtype=torch.bool)
        rows.append(torch.cat([torch.ones(n, p, dtype=torch.bool), block], 1).reshape(-1))
    mask = torch.cat(rows).to(device=device, dtype=torch.uint8)
    kv_indptr = ints([sum(prefix_lens[:i]) for i in range(bs + 1)])
    mask_indptr = ints([sum(n * (p + n) for p in prefix_lens[:i]) for i in range(bs + 1)])
    qo_indptr = ints([i * n for i in range(bs + 1)])
    o = torch.zeros_like(q)
    fwd(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask, True,
        mask_indptr, n, 1.0, 1.0, 1.0 / head_dim ** 0.5)
    return "on" if state["on"] else "off"
