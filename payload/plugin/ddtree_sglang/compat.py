"""Everything that differs between the SGLang releases the plugin serves, in one place.

* ``DFlashWorkerV2.__init__``: ``(server_args, gpu_id, ps, nccl_port, target_worker)`` in
  0.5.17-0.5.20, without ``ps`` from 0.5.21 (``releases.CTOR_*``). The scheduler passes them by
  keyword; the DDTree worker forwards whatever it gets, and :func:`check_worker_ctor` refuses a
  release whose signature is not the one ``releases`` records for it.
* The methods the scheduler calls on its algorithm that ``CustomSpecAlgo`` lacks
  (``create_future_map``, ``carries_draft_hidden_states``, ``need_topk``; 0.5.23 also
  ``get_platform_worker_cls``): :func:`borrowed_methods` takes the enum's own functions (they
  dispatch on the ``is_*`` answers, which the spec class gives) and refuses a release that lacks
  one more than ``releases`` records.
* A ``ServerArgs`` copy for the drafter (:func:`draft_args`) and publishing it while the drafter
  is built (:func:`published`): 0.5.17+ keep a process-wide copy in ``runtime_context``.
* Resolved server settings (:func:`resolved`): 0.5.17+ resolve backends and page size in a
  pipeline read through ``arg_groups.overrides.resolved_view``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from typing import Any

from ddtree_sglang import releases


class Unsupported(RuntimeError):
    """The running SGLang is not one the plugin can serve (the message says why and what is)."""


def check_worker_ctor(version: str, worker_cls: type) -> tuple[str, ...]:
    """``worker_cls.__init__``'s parameters; ``Unsupported`` unless they are the release's."""
    signature = inspect.signature(worker_cls.__init__)
    params = tuple(p for p in signature.parameters if p != "self")
    want = releases.SUPPORTED[version]["ctor"]
    if params != want:
        raise Unsupported(
            f"DDTREE plugin: SGLang {version}'s DFlashWorkerV2.__init__ takes {params}, "
            f"expected {want}; this build of SGLang differs from the released {version}.")
    return params


def borrowed_methods(version: str, algorithm_cls: type, base_cls: type) -> dict[str, Any]:
    """The enum's methods ``base_cls`` lacks, for the spec class (checked per release)."""
    missing = sorted(
        name for name, value in vars(algorithm_cls).items()
        if callable(value) and not name.startswith("_") and not hasattr(base_cls, name)
        and name not in ("from_string", "register")
    )
    want = sorted(releases.SUPPORTED[version]["borrowed"])
    if missing != want:
        raise Unsupported(
            f"DDTREE plugin: SGLang {version}'s SpeculativeAlgorithm has {missing} beyond "
            f"CustomSpecAlgo, expected {want}.")
    return {name: vars(algorithm_cls)[name] for name in missing}


def handle_dflash(server_args: Any) -> None:
    """DFLASH's own server-args resolution (drafter, block size, draft backend, limits)."""
    from sglang.srt.arg_groups.speculative_hook import _handle_dflash

    _handle_dflash(server_args)


def resolved(server_args: Any) -> Any:
    """The settings as SGLang resolved them (backends, page size filled in)."""
    try:
        from sglang.srt.arg_groups.overrides import resolved_view
    except ImportError:
        return server_args
    return resolved_view(server_args)


def graph_max_bs(server_args: Any) -> int | None:
    """The largest decode batch SGLang captures as a CUDA graph, where the settings name one
    (``--cuda-graph-max-bs`` became ``cuda_graph_max_bs_decode`` in 0.5.17's settings)."""
    for name in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
        value = getattr(server_args, name, None)
        if value:
            return int(value)
    return None


def draft_args(server_args: Any, block: int) -> Any:
    """A copy of ``server_args`` whose draft width is the drafter's block (the verify width is
    the tree's): the DFlash worker and its draft runner size their buffers and graphs from it."""
    args = copy.deepcopy(server_args)
    if hasattr(args, "override"):
        args.override("ddtree.draft_block", speculative_num_draft_tokens=int(block))
    else:
        args.speculative_num_draft_tokens = int(block)
    return args


@contextlib.contextmanager
def published(server_args: Any) -> Iterator[None]:
    """Make ``server_args`` the process's published copy while the drafter is built."""
    try:
        from sglang.srt.runtime_context import get_context
    except ImportError:
        yield
        return
    ctx = get_context()
    with ctx.preserve_config():
        ctx.set_server_args(server_args)
        yield


@contextlib.contextmanager
def eager(model_runner: Any, on: bool) -> Iterator[None]:
    """Run the target's forward eagerly (no CUDA-graph replay) while ``on``.

    DFLASH captures the target's verify graphs without a custom attention mask on backends that
    express DFLASH's causal block natively (triton among them), so a replayed graph would ignore
    the tree's mask; full-tree verify runs the target eagerly (the drafter's graphs still
    replay) unless ``target_attention`` made the target's graphs carry the mask."""
    saved = model_runner.decode_cuda_graph_runner
    if on:
        model_runner.decode_cuda_graph_runner = None
    try:
        yield
    finally:
        model_runner.decode_cuda_graph_runner = saved
