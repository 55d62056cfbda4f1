"""Replay a DDTree round's fixed-shape work from CUDA graphs, one graph per key (batch size).

A round's plan (the drafter's head and vocabulary top-k, the tree's build and compile) and its
walk have shapes fixed by the batch size, read nothing on the host, and cost far more in Python
and kernel launches than on the GPU: on an H200 the core's round took about 0.5 ms eager and
0.06 ms replayed from a graph at batch 1 (``benchmarks/ddtree_round.py``), and inside SGLang the
draft side was host-bound (the GPU busy 0.5 ms of a 5.6-8.4 ms step). :class:`GraphCache`
captures such a function the first time it sees a key and replays it after: one graph launch
instead of ten kernels and their allocations.

The contract of a function given to :class:`GraphCache`:

* Tensor arguments are its inputs. The first call of a key clones them into the graph's own
  input buffers; every replay copies the new arguments into those buffers first.
* Any other argument (a module holding weights, a plan object whose tensors are another graph's
  outputs) is bound by identity: the graph replays only while the same object is passed; another
  object gets an eager call.
* It reads nothing from the host that changes between calls, allocates only what the call
  itself uses, and returns tensors or objects holding them.
* Its results are the graph's own output buffers, and the graphs of one cache share one memory
  pool (what one graph frees inside its capture, a later capture may reuse, e.g. for its outputs):
  the next replay of ANY key of the same cache may overwrite them. Use them before the next call
  of the cache (a speculative round is used up before the next round's plan).

Eager, with identical results, where a graph cannot run: tensors not on CUDA, caching disabled,
a key ``capture_if`` refuses or more keys than ``max_entries``, a different bound object or other
input shapes than the graph's, or after a capture failed (then for good, with the reason kept in
:attr:`GraphCache.failed`). A capture fails cleanly rather than half-way where it can: the warm-up
runs with CUDA's sync debug mode set to error (a host read in ``fn`` raises there, before any
capture), and a failed capture restores the caller's stream.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["CudaCapturer", "GraphCache", "Captured"]


@dataclass
class Captured:
    """One captured call: its input buffers, bound objects, outputs and how to replay it."""

    inputs: list[Any]  # the graph's own input tensors; bound objects in place of the others
    outputs: Any
    replay: Callable[[], None]


class Capturer(Protocol):
    def capture(self, fn: Callable[..., Any], args: Sequence[Any]) -> Captured: ...


class CudaCapturer:
    """Captures with ``torch.cuda.CUDAGraph`` into one memory pool shared by all its graphs.

    The graphs of one cache never run at once (a round's plan for one batch size at a time), so
    they may share a pool: what one graph frees inside its capture, the next capture may reuse.
    """

    def __init__(self, warmup: int = 2) -> None:
        self.warmup = warmup
        self._pool: Any = None

    def capture(self, fn: Callable[..., Any], args: Sequence[Any]) -> Captured:
        statics = [a.clone() if isinstance(a, Tensor) else a for a in args]
        device = next(a.device for a in statics if isinstance(a, Tensor))
        with torch.cuda.device(device), torch.no_grad():
            caller = torch.cuda.current_stream()
            # Warm up off the current stream: Triton compiles, cuBLAS sets its workspace; a
            # host read in fn raises here (sync debug mode), before anything is captured.
            side = torch.cuda.Stream()
            side.wait_stream(caller)
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                with torch.cuda.stream(side):
                    for _ in range(self.warmup):
                        fn(*statics)
            finally:
                torch.cuda.set_sync_debug_mode(mode)
            caller.wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                    outputs = fn(*statics)
            except BaseException:
                # An invalidated capture can leave the capture stream current (its context
                # exits after capture_end raises): the caller's stream back, the device idle.
                torch.cuda.set_stream(caller)
                torch.cuda.synchronize(device)
                raise
        return Captured(statics, outputs, graph.replay)


def _on_cuda(args: Sequence[Any]) -> bool:
    tensors = [a for a in args if isinstance(a, Tensor)]
    return bool(tensors) and all(t.is_cuda for t in tensors)


class GraphCache:
    """``fn`` replayed from a graph per key; see the module docstring for the contract."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        enabled: bool = True,
        max_entries: int = 64,
        capturer: Capturer | None = None,
        on_cuda: Callable[[Sequence[Any]], bool] = _on_cuda,
        on_fail: Callable[[str], None] | None = None,
        capture_if: Callable[[Hashable], bool] = lambda key: True,
        on_capture: Callable[[Hashable], None] | None = None,
    ) -> None:
        self._fn = fn
        self._entries: dict[Hashable, Captured] = {}
        self._capturer = capturer if capturer is not None else CudaCapturer()
        self._on_cuda = on_cuda
        self._on_fail = on_fail
        self._capture_if = capture_if
        self._on_capture = on_capture
        self.enabled = enabled
        self.max_entries = max_entries
        self.failed: str | None = None
        self.counts = {"captured": 0, "replayed": 0, "eager": 0}

    def __call__(self, key: Hashable, *args: Any) -> Any:
        entry = self._entries.get(key)
        if entry is not None and self._same_bound(entry, args):
            for static, new in zip(entry.inputs, args, strict=True):
                if isinstance(static, Tensor) and static is not new:
                    static.copy_(new)
            entry.replay()
            self.counts["replayed"] += 1
            return entry.outputs
        if entry is not None or not self._may_capture(key, args):
            self.counts["eager"] += 1
            return self._fn(*args)
        try:
            entry = self._capturer.capture(self._fn, args)
            entry.replay()
        except Exception as exc:  # a graph is an optimisation: the eager call stays correct
            self.disable(f"{type(exc).__name__}: {exc}")
            if self._on_fail is not None:
                self._on_fail(self.failed or "")
            self.counts["eager"] += 1
            return self._fn(*args)
        self._entries[key] = entry
        self.counts["captured"] += 1
        if self._on_capture is not None:
            self._on_capture(key)
        return entry.outputs

    def disable(self, why: str) -> None:
        """Eager from now on, the graphs (and what they hold) dropped; ``why`` kept in failed."""
        self.failed = self.failed or why
        self.enabled = False
        self._entries.clear()

    def holds(self, key: Hashable, obj: Any) -> bool:
        """Whether ``obj`` is (one of) the outputs of the graph captured for ``key``."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        outs = entry.outputs
        return outs is obj or (isinstance(outs, tuple) and any(o is obj for o in outs))

    def _may_capture(self, key: Hashable, args: Sequence[Any]) -> bool:
        return (self.enabled and len(self._entries) < self.max_entries
                and self._capture_if(key) and self._on_cuda(args))

    @staticmethod
    def _same_bound(entry: Captured, args: Sequence[Any]) -> bool:
        if len(entry.inputs) != len(args):
            return False
        for static, new in zip(entry.inputs, args, strict=True):
            if isinstance(static, Tensor):
                if not isinstance(new, Tensor) or new.shape != static.shape \
                        or new.dtype != static.dtype or new.device != static.device:
                    return False
            elif new is not static:
                return False
        return True
