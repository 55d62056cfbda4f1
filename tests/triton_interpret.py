"""The payload's Triton kernels where the tests run: on a CUDA GPU, else in Triton's interpreter.

Triton's interpreter runs a ``@triton.jit`` kernel's Python block by block with numpy, on CPU
tensors. ``TRITON_INTERPRET=1`` turns it on, but Triton reads it when a function is decorated:
at the import of the module defining it, the kernels of ``triton.language`` itself (``tl.max``,
``tl.topk``...) included, and that happens once per process, at collection, for every test.
So the :func:`kernel_device` fixture turns the interpreter on for its test only, as the variable
would have from the start: it sets the variable (Triton reads it again while a kernel runs) and
launches and calls every compiled-mode kernel (``JITFunction``) as the interpreted function
``triton.jit`` makes under the variable (``InterpretedFunction`` of the same Python function).
Everything is as it was after the test, ``triton.language`` included: Triton 3.7.1's interpreted
call of a jit function from a kernel leaves the builtins it patched patched; the fixture's call
restores them. With a CUDA GPU it changes nothing: the kernels run
compiled there.

One shortcut, exact: the interpreter reduces with a combine function it does not know one
element at a time in Python, and ``tl.sort``/``tl.topk`` (the build and top-k kernels) reduce
with XOR at every compare-and-swap stage: 16 s for one build at the issue's sizes. Here an XOR
reduction along an axis is numpy's (``np.bitwise_xor.reduce``, the same integers), 2 s for that
build; ``test_triton_interpret.py`` checks it against Python's XOR.

The tests that use the fixture are in the integration tier (tests/tiers.py): pure, but the
interpreter takes seconds a kernel.
"""

from __future__ import annotations

import importlib
import sys
import types
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

# In CI a skip is a failure unless its reason names a GPU (tests/tiers.py): this one does not.
NO_TRITON = "triton did not import (a dev dependency on Linux x86_64: uv sync installs it)"


def xor_reduce_fast(reduce_ops: type) -> Callable[..., Any]:
    """``ReduceOps.apply_impl`` with XOR reductions along an axis done by numpy."""
    import numpy as np
    from triton.language import standard

    generic = reduce_ops.apply_impl

    def apply_impl(self: Any, input: tuple[Any, ...]) -> Any:
        if (self.combine_fn == standard._xor_combine and len(input) == 1
                and self.axis is not None):
            x = input[0]
            data = np.bitwise_xor.reduce(x.handle.data, axis=self.axis, keepdims=self.keep_dims)
            return self.to_tensor(data, x.dtype)
        return generic(self, input)

    return apply_impl


def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's interpreter on, with the XOR shortcut, until the test ends."""
    pytest.importorskip("triton", reason=NO_TRITON)
    from triton.runtime import interpreter, jit

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return interpreter.InterpretedFunction(self.fn).run(*args, grid=grid, warmup=warmup,
                                                            **kwargs)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:  # a kernel calling a jit function
        # The interpreted call patches triton.language's parts that the function's globals name
        # (for tl.sort: triton.language.core, not patched by the kernel's launch) and never
        # restores them; patched here first (the same attributes), they are restored after it
        scope = interpreter._patch_lang(self.fn)
        try:
            return interpreter.InterpretedFunction(self.fn)(*args, **kwargs)
        finally:
            scope.restore()

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(jit.JITFunction, "run", run)
    monkeypatch.setattr(jit.JITFunction, "__call__", call)
    monkeypatch.setattr(interpreter.ReduceOps, "apply_impl",
                        xor_reduce_fast(interpreter.ReduceOps))


@pytest.fixture
def kernel_device(monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the test runs the payload's kernels: "cuda" on a CUDA GPU, else "cpu" with Triton's
    interpreter on for the test (see the module docstring)."""
    pytest.importorskip("triton", reason=NO_TRITON)
    if torch.cuda.is_available():
        return "cuda"
    interpret(monkeypatch)
    return "cpu"


@pytest.fixture
def sglang_extend_kernel(kernel_device: str, tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """SGLang 0.5.17's ``extend_attention_fwd`` (the plugin's first release), from the real
    wheel's files (tests/wheels.toml), run where ``kernel_device`` says: its Triton backend's
    kernel for a verify block, the one the tree kernel is checked against."""
    from wheelcache import wheel

    folder = "sglang/kernels/ops/attention"
    parts = ("extend_attention", "decode_attention", "prefill_attention", "score_mod")
    with zipfile.ZipFile(wheel("sglang", "0.5.17")) as zf:
        for name in parts:
            zf.extract(f"{folder}/{name}.py", tmp_path)
    for pkg in ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
                "sglang.srt"):
        module = types.ModuleType(pkg)
        module.__path__ = [str(tmp_path / pkg.replace(".", "/"))]  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, pkg, module)
    utils = types.ModuleType("sglang.srt.utils")  # the one other import: the platform probes
    utils.is_cuda = torch.cuda.is_available  # type: ignore[attr-defined]
    utils.is_hip = utils.is_gfx95_supported = lambda: False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, utils.__name__, utils)
    loaded = [f"sglang.kernels.ops.attention.{m}" for m in parts]
    try:
        yield importlib.import_module(loaded[0]).extend_attention_fwd
    finally:
        for name in loaded:
            sys.modules.pop(name, None)
