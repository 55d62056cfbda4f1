"""tests/triton_interpret.py: Triton's interpreter for one test, and its XOR shortcut is XOR.

Triton 3.7.1's interpreter replaces ``triton.language``'s builtins while a kernel runs; a jit
function a kernel calls (``tl.sort`` calls ``standard``'s) patches the modules its own globals
name and never puts them back. The fixture undoes that too: after the test every attribute of
``triton.language`` and its parts is the one from before (Triton's cached rewrite of a jit
function adds names to its module, and replaces none).
"""

from __future__ import annotations

import functools
import inspect
import operator
import os
from typing import Any

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


_LANG = (tl, tl.core, tl.math, tl.standard, tl.core.tensor, tl.core.dtype,
         tl.core.tensor_descriptor_base)  # what the interpreter patches


def _lang_attributes() -> dict[tuple[Any, str], Any]:
    """Every attribute of the parts of triton.language the interpreter patches, inherited ones
    included (Triton's restore sets a class's inherited attribute on the class itself)."""
    return {(owner, name): inspect.getattr_static(owner, name) for owner in _LANG
            for name in dir(owner)
            if name != "__annotations__"}  # made by Python when read (inspect reads it)


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


def test_a_kernel_calling_jit_functions_leaves_triton_language_as_it_was() -> None:
    before = _lang_attributes()
    x = torch.arange(16, dtype=torch.int64)
    out = torch.empty(16, dtype=torch.int64)
    top = torch.empty(4, dtype=torch.int64)
    with pytest.MonkeyPatch.context() as mp:
        interpret(mp)
        _sort_kernel[(1,)](x, out, top, N=16, K=4)  # tl.sort/tl.topk: jit functions it calls
    assert out.tolist() == list(range(15, -1, -1))  # it ran in the interpreter
    after = _lang_attributes()
    changed = [f"{owner.__name__}.{name}" for (owner, name), value in before.items()
               if after[owner, name] is not value]
    assert changed == []
    # Added, never replaced: Triton's rewrite of a jit function (made once, cached) runs it in
    # its module's globals with the interpreter's own names added where the module had none
    added = {name for owner, name in after.keys() - before.keys()}
    assert added <= vars(interpreter).keys()
