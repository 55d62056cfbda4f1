"""tests/triton_interpret.py: Triton's interpreter for one test, and its XOR shortcut is XOR."""

from __future__ import annotations

import functools
import operator
import os

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton did not import (a dev dependency on "
                                              "Linux x86_64: uv sync installs it)")
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter, jit  # noqa: E402
from triton_interpret import interpret, kernel_device  # noqa: E402, F401  (fixture)


@triton.jit
def _xor_kernel(x_ptr, rows_ptr, cols_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    tl.store(rows_ptr + r, tl.xor_sum(x, 1))
    tl.store(cols_ptr + c[None, :], tl.xor_sum(x, 0, keep_dims=True))


@triton.jit
def _sort_kernel(x_ptr, out_ptr, top_ptr, N: tl.constexpr, K: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(out_ptr + i, tl.sort(x, descending=True))
    tl.store(top_ptr + tl.arange(0, K), tl.topk(x, K))


def test_the_xor_reductions_are_pythons_xor(kernel_device: str) -> None:  # noqa: F811
    gen = torch.Generator().manual_seed(7)
    for dtype in (torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        x = torch.randint(info.min, info.max, (4, 8), generator=gen, dtype=dtype)
        rows = torch.empty(4, dtype=dtype)
        cols = torch.empty(8, dtype=dtype)
        xd, rd, cd = (t.to(kernel_device) for t in (x, rows, cols))
        _xor_kernel[(1,)](xd, rd, cd, R=4, C=8)
        values = x.tolist()
        assert rd.cpu().tolist() == [functools.reduce(operator.xor, row) for row in values]
        assert cd.cpu().tolist() == [functools.reduce(operator.xor, col) for col in zip(*values,
                                                                                         strict=True)]


def test_sort_and_topk_in_the_interpreter_are_torchs(kernel_device: str) -> None:  # noqa: F811
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-(2**62), 2**62, (64,), generator=gen, dtype=torch.int64)
    out = torch.empty(64, dtype=torch.int64, device=kernel_device)
    top = torch.empty(8, dtype=torch.int64, device=kernel_device)
    _sort_kernel[(1,)](x.to(kernel_device), out, top, N=64, K=8)
    want = x.sort(descending=True).values
    assert torch.equal(out.cpu(), want) and torch.equal(top.cpu(), want[:8])


def test_the_interpreter_is_on_for_the_test_only() -> None:
    before = (os.environ.get("TRITON_INTERPRET"), jit.JITFunction.run,
              jit.JITFunction.__call__, interpreter.ReduceOps.apply_impl)
    with pytest.MonkeyPatch.context() as mp:
        interpret(mp)
        assert os.environ["TRITON_INTERPRET"] == "1"
        assert jit.JITFunction.run is not before[1]
    after = (os.environ.get("TRITON_INTERPRET"), jit.JITFunction.run,
             jit.JITFunction.__call__, interpreter.ReduceOps.apply_impl)
    assert after == before
