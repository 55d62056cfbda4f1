"""DDTREE as SGLang sees it: the spec class handed to ``SpeculativeAlgorithm.register`` and the
server-args resolution it runs.

DDTREE is DFLASH's drafter with a tree verifier, so the spec class answers ``is_dflash()`` and
``is_dflash_family()`` (every DFLASH branch of the scheduler, model runner and graph runners
applies: hidden-state capture, draft KV, the verify input type, DFLASH's request checks) and
``supports_target_verify_for_draft()`` (the drafter runs a verify-shaped forward). The methods the
scheduler calls that ``CustomSpecAlgo`` lacks are the enum's own (``compat.borrowed_methods``).

Sizes, as in the 0.5.11 patch set: ``speculative_num_draft_tokens`` becomes the verify width
(``budget + 1`` in full-tree mode, the block in shadow-linear mode): SGLang reserves KV per
round and sizes the target's verify buffers from it; the drafter's block stays in
``speculative_dflash_block_size`` and the worker gives the drafter a copy of the settings with
that width (``compat.draft_args``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ddtree_sglang import compat
from ddtree_sglang.settings import Settings, from_env

logger = logging.getLogger(__name__)

_BACKENDS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


def _refuse(text: str) -> None:
    raise ValueError(f"DDTREE: {text}")


def resolve_server_args(args: Any, settings: Settings) -> None:
    """Check and complete ``args`` for DDTREE (after DFLASH's own resolution, run here first).

    ``ValueError`` names the flag or variable to change for every unsupported combination."""
    compat.handle_dflash(args)
    view = compat.resolved(args)
    if getattr(args, "speculative_draft_window_size", None) is not None:
        _refuse("--speculative-draft-window-size is not supported (the tree's verify needs the "
                "drafter's whole context); drop it.")
    page = getattr(view, "page_size", None)
    if page not in (None, 1):
        _refuse(f"needs --page-size 1 (accepted tree nodes are re-linked one KV slot at a "
                f"time), got {page}.")
    if not getattr(args, "disable_overlap_schedule", False):
        _refuse("runs without overlap scheduling: add --disable-overlap-schedule.")
    for name in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        if float(getattr(args, name, 1.0)) != 1.0:
            _refuse(f"verifies exactly; leave --{name.replace('_', '-')} at 1.0.")
    if not settings.shadow_linear:
        chosen = {name: getattr(view, name, None) for name in _BACKENDS}
        if chosen.get("attention_backend") != "triton" or any(
            value not in (None, "triton") for value in chosen.values()
        ):
            shown = ", ".join(f"{k}={v}" for k, v in chosen.items() if v)
            _refuse(f"full-tree verification needs the triton attention backend (a custom tree "
                    f"mask), got {shown or 'none named'}: add --attention-backend triton, or set "
                    f"SGLANG_DDTREE_SHADOW_LINEAR=1 to verify the linear chain only.")
    block = args.speculative_num_draft_tokens
    if block is None or int(block) < 2:
        _refuse(f"needs a draft block of at least 2 tokens, got {block}.")
    block = int(block)
    if not settings.shadow_linear and settings.budget + 1 < block:
        _refuse(f"SGLANG_DDTREE_BUDGET={settings.budget} is too small for the drafter's block of "
                f"{block} tokens (the verify width budget + 1 must hold it): use "
                f"SGLANG_DDTREE_BUDGET={block - 1} or more.")
    args.speculative_dflash_block_size = block
    args.speculative_num_draft_tokens = block if settings.shadow_linear else settings.budget + 1
    logger.info("DDTREE (plugin): budget=%d topk=%d block=%d mode=%s verify width=%d",
                settings.budget, settings.topk, block, settings.mode,
                args.speculative_num_draft_tokens)


def make_spec_class(version: str, algorithm_cls: type, base_cls: type) -> type:
    """The ``spec_class`` for ``register``: ``base_cls`` (``CustomSpecAlgo``) with DFLASH's
    identity, DDTREE's server-args resolution and the enum's methods the base lacks."""
    namespace: dict[str, Any] = dict(compat.borrowed_methods(version, algorithm_cls, base_cls))

    def is_dflash(self: Any) -> bool:
        return True

    def handle_server_args(self: Any, server_args: Any) -> None:
        resolve_server_args(server_args, from_env(os.environ))

    namespace.update(
        is_dflash=is_dflash,
        is_dflash_family=is_dflash,
        supports_target_verify_for_draft=is_dflash,
        handle_server_args=handle_server_args,
        __doc__="DDTREE (ddtree-sglang-plugin): DFLASH's drafter, DDTree's verifier.",
    )
    return type("DDTreeSpec", (base_cls,), namespace)
