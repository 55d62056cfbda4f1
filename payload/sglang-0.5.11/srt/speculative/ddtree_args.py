"""DDTree server flags and their checks for SGLang 0.5.11 (imports nothing heavy).

DDTREE is DFLASH plus a tree verifier, so ``ServerArgs`` first runs DFlash's own checks for it
(hidden-state capture, overlap scheduling off, block size resolution) and then
:func:`resolve_ddtree_server_args`, which adds DDTree's constraints:

* ``page_size`` must be 1 (accepted tree nodes are not contiguous in the verify block; their KV
  slots are re-linked in path order, which needs single-token pages);
* no overlap scheduling (DFlash already forces it off; an explicit request is refused);
* no rejection sampling: the tree is verified greedily (target argmax), so the accept thresholds
  must keep their defaults; non-greedy requests are verified greedily too (logged once);
* full-tree mode needs the triton attention backend (the only one in 0.5.11 that applies
  DFlash's custom verify mask on every path, CUDA graphs included). With no backend chosen we
  pick triton; with another backend chosen we refuse, unless ``--speculative-ddtree-shadow-linear``
  is set: then the tree is built and scored but the linear chain is verified, which every DFlash
  backend supports.

Sizes: the draft block (``--speculative-num-draft-tokens`` / ``--speculative-dflash-block-size``,
16 for ``*-b16`` drafters) stays in ``speculative_dflash_block_size``; in full-tree mode the verify
width ``speculative_num_draft_tokens`` becomes ``budget + 1`` (root + budget nodes), which is what
the target's attention backend, CUDA graphs and KV accounting size for.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

logger = logging.getLogger(__name__)

DDTREE = "DDTREE"
DEFAULT_BUDGET = 32
MAX_BUDGET = 1024


def add_ddtree_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--speculative-ddtree-{budget,topk,shadow-linear}`` to SGLang's parser."""
    parser.add_argument(
        "--speculative-ddtree-budget",
        type=int,
        default=None,
        help=f"DDTREE only. Number of draft-tree nodes verified per round (default {DEFAULT_BUDGET}).",
    )
    parser.add_argument(
        "--speculative-ddtree-topk",
        type=int,
        default=None,
        help="DDTREE only. Candidates per depth considered for the tree (default: the budget).",
    )
    parser.add_argument(
        "--speculative-ddtree-shadow-linear",
        action="store_true",
        default=False,
        help="DDTREE only. Build and score the tree but verify and commit the linear chain.",
    )


def _positive(value: Any, flag: str, default: int) -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"DDTREE {flag} must be an integer, got {value!r}.") from None
    if number < 1 or number > MAX_BUDGET:
        raise ValueError(f"DDTREE {flag} must be between 1 and {MAX_BUDGET}, got {number}.")
    return number


def resolve_ddtree_server_args(args: Any) -> None:
    """Check and complete a ``ServerArgs`` whose algorithm is DDTREE (after DFlash's checks).

    Raises ``ValueError`` with the flag to change for every unsupported combination.
    """
    budget = _positive(args.speculative_ddtree_budget, "--speculative-ddtree-budget", DEFAULT_BUDGET)
    topk = _positive(args.speculative_ddtree_topk, "--speculative-ddtree-topk", budget)
    args.speculative_ddtree_budget = budget
    args.speculative_ddtree_topk = topk
    shadow = bool(args.speculative_ddtree_shadow_linear)

    if args.page_size is not None and int(args.page_size) != 1:
        raise ValueError(f"DDTREE needs --page-size 1, got {args.page_size}.")
    args.page_size = 1
    if getattr(args, "enable_dp_attention", False):
        raise ValueError("DDTREE does not support --enable-dp-attention.")
    if float(args.speculative_accept_threshold_single) != 1.0 or float(
        args.speculative_accept_threshold_acc
    ) != 1.0:
        raise ValueError(
            "DDTREE verifies greedily (no rejection sampling); leave "
            "--speculative-accept-threshold-single/-acc at 1.0."
        )
    # DFlash's checks set this; an explicit overlap request cannot be honoured.
    if not args.disable_overlap_schedule:
        raise ValueError("DDTREE does not support overlap scheduling; drop the overlap flags.")

    backends = {
        name: getattr(args, name, None)
        for name in ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
    }
    chosen = {name: value for name, value in backends.items() if value}
    if not shadow:
        if not chosen:
            args.attention_backend = "triton"
            logger.info("DDTREE full-tree mode: using --attention-backend triton.")
        else:
            others = {name: value for name, value in chosen.items() if value != "triton"}
            if others:
                listed = ", ".join(f"{k}={v}" for k, v in sorted(others.items()))
                raise ValueError(
                    "DDTREE full-tree verification needs the triton attention backend, got "
                    f"{listed}. Use --attention-backend triton, or add "
                    "--speculative-ddtree-shadow-linear to verify the linear chain only."
                )

    block = args.speculative_num_draft_tokens
    if block is None or int(block) < 2:
        raise ValueError(f"DDTREE needs a draft block of at least 2 tokens, got {block}.")
    args.speculative_dflash_block_size = int(block)
    args.speculative_num_draft_tokens = int(block) if shadow else budget + 1


def ddtree_draft_block_size(args: Any) -> int:
    """The drafter's block size (root + depths) of a resolved DDTREE ``ServerArgs``."""
    return int(args.speculative_dflash_block_size)
