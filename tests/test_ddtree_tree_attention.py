"""The verify block's split-KV attention (payload/ddtree/tree_attention.py) against attention
written out in torch, and its wrapper in front of SGLang's extend kernel.

Runs on a CUDA GPU, or on the CPU in Triton's interpreter (the ``kernel_device`` fixture,
tests/triton_interpret.py), there at smaller shapes that still take every branch of the kernels
(GQA groups of 1, 2 and 4, several KV heads and requests, empty and partial splits, a split
walked in two chunks, an empty prefix, row, block and head-dim tails). The prefix part of
SGLang's flattened mask is filled with random bits here: the kernel must read only the tree
columns (every prefix column is visible).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload"))

from triton_interpret import kernel_device, sglang_extend_kernel  # noqa: E402, F401  (fixtures)

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # kernel_device's answer
pytestmark = pytest.mark.usefixtures("kernel_device")  # every test here runs a kernel


def reference(q: torch.Tensor, k_ext: torch.Tensor, v_ext: torch.Tensor, k_buf: torch.Tensor,
              v_buf: torch.Tensor, lens: list[int], locs: list[torch.Tensor],
              masks: list[torch.Tensor], n: int) -> torch.Tensor:
    heads, group = q.shape[1], q.shape[1] // k_ext.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float32)
    for b, length in enumerate(lens):
        keys = torch.cat([k_buf[locs[b]], k_ext[b * n:(b + 1) * n]]).float().cpu()
        vals = torch.cat([v_buf[locs[b]], v_ext[b * n:(b + 1) * n]]).float().cpu()
        allow = torch.cat([torch.ones(n, length, dtype=torch.bool), masks[b]], 1)
        for h in range(heads):
            s = q[b * n:(b + 1) * n, h].float().cpu() @ keys[:, h // group].T / q.shape[2] ** 0.5
            out[b * n:(b + 1) * n, h] = torch.softmax(s.masked_fill(~allow, float("-inf")), -1) \
                @ vals[:, h // group]
    return out


def make(bs: int, n: int, heads: int, kv_heads: int, dim: int, lens: list[int],
         seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    slots = 1 + sum(lens) + 8

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    q, k_ext = rnd(bs * n, heads, dim), rnd(bs * n, kv_heads, dim)
    v_ext = rnd(bs * n, kv_heads, dim)
    k_buf, v_buf = rnd(slots, kv_heads, dim), rnd(slots, kv_heads, dim)
    perm = torch.randperm(slots - 1, generator=g) + 1
    locs, off = [], 0
    for length in lens:
        locs.append(perm[off:off + length])
        off += length
    masks, flat, mask_indptr = [], [], [0]
    for b in range(bs):  # a random tree's ancestor sets (parent before child), diagonal on
        parent = [-1] + [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, n)]
        m = torch.zeros(n, n, dtype=torch.bool)
        for j in range(n):
            a = j
            while a >= 0:
                m[j, a], a = True, parent[a]
        masks.append(m)
        rows = torch.cat([torch.rand(n, lens[b], generator=g) < 0.5, m], 1)
        flat.append(rows.reshape(-1))
        mask_indptr.append(mask_indptr[-1] + rows.numel())
    kv_indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    d = {"q": q, "k_ext": k_ext, "v_ext": v_ext, "k_buf": k_buf, "v_buf": v_buf,
         "qo_indptr": torch.arange(0, (bs + 1) * n, n, dtype=torch.int32),
         "kv_indptr": kv_indptr, "kv_indices": torch.cat(locs),
         "custom_mask": torch.cat(flat), "mask_indptr": torch.tensor(mask_indptr)}
    d = {k: v.to(DEV) for k, v in d.items()}
    d["want"] = reference(q, k_ext, v_ext, k_buf, v_buf, lens, locs, masks, n)
    return d


# (bs, n, heads, kv_heads, dim, prefix lengths). On a GPU the shapes; in the interpreter
# (seconds a program) fewer heads: a GQA group of 4 over 64 rows, one partial split and empty
# ones; 2 KV heads of groups of 2 for two requests, a prefix over three splits; groups of 1 with
# 8 rows of 16 (row and block tails), an empty prefix and one of 64 and 65; a head dim of 48 (of
# 64) and a prefix of 1000 whose splits walk two chunks each.
CASES = [(1, 16, 32, 8, 128, [37]), (2, 16, 8, 2, 64, [5, 130]), (3, 8, 4, 2, 16, [0, 64, 65]),
         (1, 32, 32, 8, 128, [200]), (5, 8, 32, 32, 16, [3, 70, 0, 1, 129]),
         (1, 8, 2, 1, 48, [1000])] if DEV == "cuda" else \
    [(1, 16, 4, 1, 128, [37]), (2, 8, 4, 2, 64, [5, 130]), (3, 8, 2, 2, 16, [0, 64, 65]),
     (1, 8, 2, 1, 48, [1000])]


def _args(d: dict[str, Any], o: torch.Tensor, n: int, mask: Any = "tree") -> tuple[Any, ...]:
    """SGLang's positional call of ``extend_attention_fwd`` from its Triton backend."""
    return (d["q"], d["k_ext"], d["v_ext"], o, d["k_buf"], d["v_buf"], d["qo_indptr"],
            d["kv_indptr"], d["kv_indices"], d["custom_mask"] if mask == "tree" else mask, True,
            d["mask_indptr"], n, 1.0, 1.0, None)


@pytest.mark.parametrize(("bs", "n", "heads", "kv_heads", "dim", "lens"), CASES)
def test_the_kernel_is_attention_under_the_tree_mask(bs: int, n: int, heads: int, kv_heads: int,
                                                     dim: int, lens: list[int]) -> None:
    from ddtree import tree_attention as ta

    d = make(bs, n, heads, kv_heads, dim, lens, seed=bs * 100 + n)
    o = torch.empty_like(d["q"])
    ta.tree_verify_attention(d["q"], d["k_ext"], d["v_ext"], o, d["k_buf"], d["v_buf"],
                             d["qo_indptr"], d["kv_indptr"], d["kv_indices"], d["custom_mask"],
                             d["mask_indptr"], n)
    tol = 2e-2 if DEV == "cuda" else 1e-4
    assert float((o.float().cpu() - d["want"]).abs().max()) < tol


# A verify block of two requests for the wrapper's tests: (n, heads, kv_heads, dim), and the
# same shape for its self-check. Smaller in the interpreter.
BLOCK = (16, 8, 2, 64) if DEV == "cuda" else (8, 2, 1, 32)
SHAPE = dict(zip(("n", "heads", "kv_heads", "head_dim"), BLOCK, strict=True))


def test_the_wrapper_serves_verify_blocks_after_one_check_and_leaves_the_rest() -> None:
    from ddtree import tree_attention as ta

    calls: list[str] = []
    n = BLOCK[0]
    d = make(2, *BLOCK, [5, 40], seed=3)

    def extend(*args: Any, **kwargs: Any) -> None:  # SGLang's kernel, as torch
        calls.append("extend")
        args[3].copy_(d["want"].to(args[3].dtype))

    fwd = ta.wrap(extend)
    o = torch.empty_like(d["q"])
    fwd(*_args(d, o, n), logit_cap=0.0, sliding_window_size=-1, sinks=None,
        window_kv_offsets=None, xai_temperature_len=-1)
    assert calls == ["extend"] and fwd.ddtree_state == {"on": True, "checked": True}
    o.zero_()
    fwd(*_args(d, o, n))  # served by the tree kernel alone now
    assert calls == ["extend"]
    assert float((o.float().cpu() - d["want"]).abs().max()) < 2e-2
    fwd(*_args(d, o, n, mask=None))  # no custom mask (prefill, the drafter): the extend kernel
    fwd(*_args(d, o, n), sliding_window_size=128)  # a sliding window: the extend kernel
    assert calls == ["extend"] * 3

    wrong = ta.wrap(lambda *a, **k: a[3].fill_(7.0))  # a kernel the tree kernel disagrees with
    wrong(*_args(d, torch.empty_like(d["q"]), n))
    assert wrong.ddtree_state == {"on": False, "checked": True}
    os.environ["SGLANG_DDTREE_TREE_ATTENTION"] = "0"  # the A/B switch: SGLang's kernel only
    try:
        off = ta.wrap(extend)
    finally:
        del os.environ["SGLANG_DDTREE_TREE_ATTENTION"]
    off(*_args(d, o, n))
    assert off.ddtree_state == {"on": False, "checked": True} and calls == ["extend"] * 4


def _extend_in_torch(*args: Any, **kwargs: Any) -> None:
    """SGLang's extend kernel on a verify block, written out in torch from its positional call
    (prefix columns all visible, the block's columns under the flattened mask)."""
    q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask = args[:10]
    mask_indptr, n, scale = args[11], int(args[12]), float(args[15])
    group = q.shape[1] // k_ext.shape[1]
    for b in range(int(qo_indptr.shape[0]) - 1):
        lo, hi = int(kv_indptr[b]), int(kv_indptr[b + 1])
        locs = kv_indices[lo:hi].long()
        keys = torch.cat([k_buf[locs], k_ext[b * n:(b + 1) * n]]).float()
        vals = torch.cat([v_buf[locs], v_ext[b * n:(b + 1) * n]]).float()
        start, p = int(mask_indptr[b]), hi - lo
        rows = mask[start:start + n * (p + n)].view(n, p + n).bool()
        allow = torch.cat([torch.ones(n, p, dtype=torch.bool, device=rows.device),
                           rows[:, p:]], 1)
        for h in range(q.shape[1]):
            s = q[b * n:(b + 1) * n, h].float() @ keys[:, h // group].T * scale
            o[b * n:(b + 1) * n, h] = (torch.softmax(s.masked_fill(~allow, float("-inf")), -1)
                                       @ vals[:, h // group]).to(o.dtype)


def test_the_self_check_decides_before_any_real_block() -> None:
    from ddtree import tree_attention as ta

    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    fwd = ta.wrap(_extend_in_torch)
    assert ta.self_check(fwd, device=DEV, **SHAPE, dtype=dtype) == "on"
    assert fwd.ddtree_state == {"on": True, "checked": True}
    assert ta.self_check(fwd, device=DEV, **SHAPE, dtype=dtype) == "checked"
    wrong = ta.wrap(lambda *a, **k: a[3].fill_(7.0))  # a kernel the tree kernel disagrees with
    assert ta.self_check(wrong, device=DEV, **SHAPE, dtype=dtype) == "off"
    assert wrong.ddtree_state == {"on": False, "checked": True}
    os.environ["SGLANG_DDTREE_TREE_ATTENTION"] = "0"
    try:
        off = ta.wrap(_extend_in_torch)
    finally:
        del os.environ["SGLANG_DDTREE_TREE_ATTENTION"]
    assert ta.self_check(off, device=DEV, **SHAPE, dtype=dtype) == "off"


def test_the_tree_kernel_agrees_with_sglang_0517s_own_extend_kernel(
        sglang_extend_kernel: Any) -> None:  # noqa: F811
    """SGLang 0.5.17's extend kernel (its files from the real wheel; the plugin's release) on a
    verify block: the same as attention under the tree mask with every prefix column visible (it
    skips the mask's prefix part), and the wrapper's self-check turns the tree kernel on."""
    from ddtree import tree_attention as ta

    d = make(2, *BLOCK, [5, 130], seed=11)
    o = torch.zeros_like(d["q"])
    sglang_extend_kernel(*_args(d, o, BLOCK[0]))  # the mask's prefix bits are random: skipped
    tol = 2e-2 if DEV == "cuda" else 1e-4
    assert float((o.float().cpu() - d["want"]).abs().max()) < tol
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    fwd = ta.wrap(sglang_extend_kernel)
    assert ta.self_check(fwd, device=DEV, **SHAPE, dtype=dtype) == "on"
