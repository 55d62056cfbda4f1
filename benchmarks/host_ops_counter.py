"""The counter of benchmarks/ddtree_host_ops.py: what one round does on the device and the host.

A ``TorchDispatchMode`` counts ATen ops and a ``TorchFunctionMode`` tracks which tensors would
live on the GPU in SGLang (the batch's device tensors, what is computed from them, factories
given a ``device=``; what ``.cpu()`` returns is a host tensor), so that each op is a kernel, a
view or bare allocation, or host work, and device->host reads and host->device copies are
counted as syncs and H2D copies. The payload's core calls, Triton kernels on CUDA, count as their
launches (``Session.triton``). What each count means: ddtree_host_ops.py's docstring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

# Core calls that are Triton kernels on CUDA: (launches, torch.empty allocations in the wrapper).
TRITON_CORE = {"draft_topk": (2, 5), "build_tree": (1, 6), "compile_tree": (1, 4),
               "walk_tree": (1, 4)}
VIEW_OPS = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "slice", "select", "expand", "unsqueeze",
    "squeeze", "t", "transpose", "permute", "as_strided", "alias", "detach", "unbind", "split",
    "narrow", "lift_fresh", "view_as", "empty", "empty_like", "empty_strided", "new_empty",
}
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2"}


class Tracker:
    """Which tensors would live on the GPU in SGLang (ids of live tensors, weakly held)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}
        self.factory_device = False

    def add(self, t: Any) -> None:
        for leaf in pytree.tree_leaves(t):
            if isinstance(leaf, torch.Tensor):
                self._refs[id(leaf)] = weakref.ref(leaf)

    def discard(self, t: torch.Tensor) -> None:
        self._refs.pop(id(t), None)

    def has(self, t: torch.Tensor) -> bool:
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t


@dataclasses.dataclass
class Counts:
    kernels: Counter[str] = dataclasses.field(default_factory=Counter)
    views: Counter[str] = dataclasses.field(default_factory=Counter)
    host: Counter[str] = dataclasses.field(default_factory=Counter)
    syncs: Counter[str] = dataclasses.field(default_factory=Counter)
    h2d: Counter[str] = dataclasses.field(default_factory=Counter)
    sizes: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    split: dict[str, int] = dataclasses.field(default_factory=dict)  # kernels per phase

    def summary(self) -> dict[str, int]:
        return {"aten_ops": sum(self.kernels.values()) - self.kernels["triton"]
                + sum(self.views.values()) + sum(self.host.values()),
                "kernels": sum(self.kernels.values()), "triton": self.kernels["triton"],
                "views_allocs": sum(self.views.values()), "host_ops": sum(self.host.values()),
                "syncs": sum(self.syncs.values()), "h2d": sum(self.h2d.values())}


class DispatchCounter(TorchDispatchMode):
    def __init__(self, tracker: Tracker, counts: Counts) -> None:
        super().__init__()
        self.tracker, self.counts, self.paused = tracker, counts, 0

    def __torch_dispatch__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        device = any(self.tracker.has(t) for t in ins) or (not ins and self.tracker.factory_device)
        if device:
            self.tracker.add(out)
        if self.paused:
            return out
        name = func.overloadpacket.__name__
        if not device:
            self.counts.host[name] += 1
            return out
        bool_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in pytree.tree_leaves(args[1:2]))
        if name in SYNC_OPS or bool_index:
            self.counts.syncs[name + (" (bool mask)" if bool_index else "")] += 1
        (self.counts.views if name in VIEW_OPS else self.counts.kernels)[name] += 1
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.counts.sizes.append((name, leaf.numel()))
        return out


_FACTORIES = {torch.tensor, torch.as_tensor, torch.arange, torch.zeros, torch.ones, torch.full,
              torch.empty, torch.eye}


class FunctionTracker(TorchFunctionMode):
    """Marks factories given ``device=`` as device tensors; counts D2H reads and H2D copies."""

    def __init__(self, tracker: Tracker, counts: Counts, dispatch: DispatchCounter) -> None:
        super().__init__()
        self.tracker, self.counts, self.dispatch = tracker, counts, dispatch

    def __torch_function__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _FACTORIES:
            on_device = kwargs.get("device") is not None
            before, self.tracker.factory_device = self.tracker.factory_device, on_device
            try:
                out = func(*args, **kwargs)
            finally:
                self.tracker.factory_device = before
            if on_device:
                self.tracker.add(out)
                if func in (torch.tensor, torch.as_tensor) and not self.dispatch.paused:
                    self.counts.h2d[func.__name__] += 1
                    # a blocking copy from pageable memory: torch waits for the stream
                    self.counts.syncs[f"H2D blocking ({func.__name__}(device=))"] += 1
            return out
        counting = not self.dispatch.paused
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        on_dev = src is not None and self.tracker.has(src)
        if func is torch.Tensor.cpu and src is not None:
            out = func(*args, **kwargs)
            if on_dev and counting:
                self.counts.syncs["D2H copy (.cpu())"] += 1
            with self.pause():
                out = out.detach()  # a new object: the host copy
            self.tracker.discard(out)
            return out
        if func is torch.Tensor.to and src is not None and not on_dev \
                and _to_device(args[1:], kwargs):
            out = func(*args, **kwargs)
            if out is src:
                with self.pause():
                    out = out.detach()
            self.tracker.add(out)
            if counting:
                self.counts.h2d[".to(device)"] += 1
                if not kwargs.get("non_blocking") and not (len(args) > 2 and args[2] is True):
                    self.counts.syncs["H2D blocking (.to(device))"] += 1
            return out
        if func in (torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy) and on_dev \
                and counting:
            self.counts.syncs[f"D2H read (.{func.__name__}())"] += 1
            with self.pause():
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        self.dispatch.paused += 1
        try:
            yield
        finally:
            self.dispatch.paused -= 1


def _to_device(args: Any, kwargs: Any) -> bool:
    return kwargs.get("device") is not None or (
        bool(args) and isinstance(args[0], (str, torch.device)))


class Session:
    """One counting session: both modes, a region helper for the core's Triton calls."""

    def __init__(self) -> None:
        self.tracker, self.counts = Tracker(), Counts()
        self.dispatch = DispatchCounter(self.tracker, self.counts)
        self.function = FunctionTracker(self.tracker, self.counts, self.dispatch)
        self.active = False
        self.core_ns = 0  # time inside the core's calls (their CPU torch path)

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self.active = True
        try:
            with self.dispatch, self.function:
                yield
        finally:
            self.active = False

    def triton(self, name: str, fn: Any) -> Any:
        """``fn`` as its CUDA launch count: run (uncounted), outputs on the device."""
        launches, allocs = TRITON_CORE[name]

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                if not self.active:
                    return fn(*args, **kwargs)
                with self.function.pause():
                    out = fn(*args, **kwargs)
            finally:
                self.core_ns += time.perf_counter_ns() - t0
            self.counts.kernels["triton"] += launches
            self.counts.views["empty"] += allocs
            self.tracker.add(_leaves(out))
            return out

        return wrapped

    def launch(self, name: str) -> None:
        if self.active and not self.dispatch.paused:
            self.counts.kernels["triton"] += 1


def _leaves(out: Any) -> list[torch.Tensor]:
    if dataclasses.is_dataclass(out):
        return [getattr(out, f.name) for f in dataclasses.fields(out)
                if isinstance(getattr(out, f.name), torch.Tensor)]
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
