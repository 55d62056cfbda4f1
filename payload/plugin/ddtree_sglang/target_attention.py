"""The target's verify attention on SGLang 0.5.17+: the tree kernel, and graphs with the mask.

Both are ON by default from plugin 0.3.4 (``settings.Switch``; opt-in in 0.3.2-0.3.3 until the
rehearsal proved them lossless on an H200, session 8 call 1: a speculative decoder must never
serve silently different tokens). ``SGLANG_DDTREE_TREE_ATTENTION=0`` /
``SGLANG_DDTREE_VERIFY_GRAPH=0`` turn them off (A/B switches): off, the plugin verifies as it
did when first proven on the H200 (6ebdc14: the full tree eagerly, SGLang's extend kernel). The
0.5.11 patch set's tree kernel is on by default there too. Both change the TARGET
model runner's triton backend (never the drafter's), from the worker's
``init_attention_backends``: SGLang builds every worker's attention backends before it captures
any CUDA graph (``Scheduler.init_model_worker``: ``init_all_attention_backends``, then
``init_all_cuda_graphs``), the target's first, so the target's backend exists there and its
graphs are not captured yet (:func:`prepare` checks that they are not).

1. **The tree kernel** (``ddtree.tree_attention``, as in the 0.5.11 patch set): the backend's
   ``extend_attention_fwd`` wrapped, so verify blocks (a custom mask, N queries a request) go
   through the split-KV tree kernel; checked once against SGLang's kernel at once, on a
   synthetic block of the model's shape (``tree_attention.self_check``: the first real block
   would be a graph capture's warm-up, whose mask is a placeholder). A mismatch or an error
   leaves SGLang's kernel serving (whatever the switch says). ``0``: SGLang's kernel, not even
   wrapped.
2. **Verify graphs with the tree's mask.** DFLASH's block is causal, so SGLang captures the
   target's verify graphs without a custom mask on the backends it lists in
   ``dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS`` (by class name; triton among them
   from 0.5.1x), and a replay would ignore the tree's mask. The target's backend object is given
   a subclass of its own class, of another name (:data:`GRAPH_CLASS`), and nothing else: the
   graph runner's policy (``resolve_dflash_verify_mask_policy``) then captures the verify with
   the backend's mask buffer, and every replay copies the round's mask into it
   (``TritonAttnBackend._update_target_verify_buffers``), as SGLang 0.5.11 did for triton.
   Without it (switched off, CUDA graphs off, graphs already captured, a
   backend other than triton, or SGLang's policy still saying no mask) the worker runs the
   full-tree verify eagerly (``compat.eager``), as the plugin did before.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddtree_sglang.settings import Switch

logger = logging.getLogger(__name__)

BACKEND_CLASS = "TritonAttnBackend"
GRAPH_CLASS = "DDTreeTritonAttnBackend"


def _said(verdict: str, why: str) -> str:
    """``verdict`` with ``why`` in its parentheses (``off (x)`` -> ``off (x; why)``)."""
    return f"{verdict[:-1]}; {why})" if verdict.endswith(")") else f"{verdict} ({why})"


def _backends(runner: Any) -> list[Any]:
    """The runner's triton backends (``attn_backend``; a separate decode one where there is)."""
    out: list[Any] = []
    for backend in (getattr(runner, "attn_backend", None),
                    getattr(runner, "decode_attn_backend", None)):
        if backend is not None and type(backend).__name__ in (BACKEND_CLASS, GRAPH_CLASS) \
                and all(backend is not b for b in out):
            out.append(backend)
    return out


def wrap_tree_kernel(runner: Any, n: int, tp_size: int) -> str:
    """Put the tree kernel in front of each triton backend's extend kernel and check it."""
    from ddtree.tree_attention import self_check, wrap

    backends = _backends(runner)
    if not backends:
        return "off (not the triton backend)"
    cfg = runner.model_config
    verdict = "off"
    for backend in backends:
        if getattr(backend.extend_attention_fwd, "ddtree_state", None) is None:
            # switched on by the plugin's settings (an empty variable is the default, on):
            # not by the core's own reading of the environment
            backend.extend_attention_fwd = wrap(backend.extend_attention_fwd, on=True)
        fwd = backend.extend_attention_fwd
        try:
            verdict = self_check(fwd, device=runner.device,
                                 heads=int(cfg.get_num_attention_heads(tp_size)),
                                 kv_heads=int(cfg.get_num_kv_heads(tp_size)),
                                 head_dim=int(cfg.head_dim), n=int(n), dtype=runner.dtype)
            if verdict == "off":  # a mismatch or an error (its own log line says which)
                verdict = "off (its start-up check failed: SGLang's extend kernel serves)"
        except Exception as exc:  # unchecked: never served (SGLang's kernel throughout)
            fwd.ddtree_state.update(on=False, checked=True)
            verdict = f"off (the check could not run: {type(exc).__name__}: {exc})"
    return verdict


def mask_in_graphs(runner: Any) -> str | None:
    """Make the target's verify graphs carry the tree's mask; None when done, else why not."""
    if getattr(runner, "decode_cuda_graph_runner", None) is not None:
        return "the target's graphs were captured before the drafter's attention backends"
    backends = _backends(runner)
    if not backends or backends[0] is not getattr(runner, "attn_backend", None):
        return "the target's attention backend is not triton"
    from sglang.srt.speculative import dflash_utils

    policy = dflash_utils.resolve_dflash_verify_mask_policy
    for backend in backends:
        cls = type(backend)
        if cls.__name__ != GRAPH_CLASS:
            backend.__class__ = type(GRAPH_CLASS, (cls,), {
                "__doc__": "SGLang's triton backend whose verify graphs take the DDTree mask.",
                "__module__": __name__})
    if not policy(runner.attn_backend)[1]:
        for backend in backends:  # undone: SGLang would still capture without the mask
            backend.__class__ = type(backend).__mro__[1]
        return "SGLang's DFLASH mask policy still answers no custom mask"
    return None


def graphs_hold_mask(runner: Any) -> str | None:
    """After capture: None when the target's verify graphs were captured on the changed backend
    (so they read the mask buffer), else why not (the worker then verifies eagerly)."""
    graphs = getattr(runner, "decode_cuda_graph_runner", None)
    if graphs is None:
        return None  # no graphs: every verify runs eagerly, with the mask
    backend = getattr(graphs, "attn_backend", None) or getattr(runner, "attn_backend", None)
    if type(backend).__name__ != GRAPH_CLASS:
        return f"the target's graphs were captured on {type(backend).__name__}"
    return None


def prepare(runner: Any, *, tree_mode: bool, n: int, tp_size: int, graphs_on: bool,
            tree_attention: Switch, verify_graph: Switch) -> bool:
    """The switched-on changes on the target's ``runner`` (see the module); True when the full-tree
    verify can replay the target's graphs (they will carry the mask). Logs which verify serves
    and why."""
    if not tree_mode:
        return False  # shadow-linear: DFLASH's causal block, its graphs as they are
    if not tree_attention.on:  # SGLang's kernel, not even wrapped
        verdict = _said("off", tree_attention.why)
    else:
        try:
            verdict = wrap_tree_kernel(runner, n, tp_size)
        except Exception as exc:  # SGLang's kernel serves; the server starts as before
            verdict = f"off ({type(exc).__name__}: {exc})"
        verdict = _said(verdict, tree_attention.why)
    why: str | None
    if not verify_graph.on:
        why = verify_graph.why
    elif not graphs_on:
        why = "CUDA graphs are off"
    else:
        try:
            why = mask_in_graphs(runner)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
    logger.info("DDTREE target verify: tree kernel %s; %s", verdict,
                f"CUDA graphs with the tree's mask ({verify_graph.why})" if why is None
                else f"eager ({why})")
    return why is None
