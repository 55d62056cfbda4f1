"""DDTree server flags and their checks for SGLang 0.5.11 (imports nothing heavy).

DDTREE is DFLASH plus a tree verifier, so ``ServerArgs`` first runs DFlash's own checks for it
(hidden-state capture, overlap scheduling off, block size resolution) and then
:func:`resolve_ddtree_server_args`, which adds DDTree's constraints:

* ``page_size`` must be 1 (accepted tree nodes are not contiguous in the verify block; their KV
  slots are re-linked in path order, which needs single-token pages);
* no overlap scheduling (DFlash already forces it off; an explicit request is refused);
* the accept thresholds keep their defaults (1.0): greedy requests follow the target's argmax
  through the tree; sampled requests (temperature > 0) sample the target's token at every tree
  slot with the request's temperature, top-k, top-p and min-p and follow the child holding it,
  so their output distribution is the target's (``ddtree_core.sample_tokens``); relaxed
  thresholds would change that distribution and are refused;
* the draft block must fit the verify width: ``budget + 1 >= block`` (the scheduler sizes the
  verify KV slots and req->token rows from ``budget + 1`` while the drafter writes ``block``);
* full-tree mode needs the triton attention backend (the only one in 0.5.11 that applies
  DFlash's custom verify mask on every path, CUDA graphs included). SGLang fills in a default
  backend (fa3 on Hopper, flashinfer elsewhere) long before speculative settings are handled, so
  :func:`choose_ddtree_attention_backend` runs first in ``ServerArgs.__post_init__``: with no
  backend named it picks triton; a named non-triton backend is refused there with the flag to
  use, unless ``--speculative-ddtree-shadow-linear`` is set: then the tree is built and scored
  but the linear chain is verified, which every DFlash backend supports.

Sizes: the draft block (``--speculative-num-draft-tokens`` / ``--speculative-dflash-block-size``,
16 for ``*-b16`` drafters) stays in ``speculative_dflash_block_size``; in full-tree mode the verify
width ``speculative_num_draft_tokens`` becomes ``budget + 1`` (root + budget nodes), which is what
the target's attention backend, CUDA graphs and KV accounting size for.

DFlash's checks refuse in DFLASH's name; ``ServerArgs.__post_init__`` runs them inside
:func:`ddtree_named`, so a DDTREE user reads DDTREE in those refusals (the text only: same
exception type, raised at the same check; DFLASH users read the release's own text). So does the
scheduler's ``init_model_worker``: the target's start-up checks for a DFlash drafter (its config,
the layers it reads), the drafter's load, ``DFlashWorker.__init__`` (the mask token) and
``DDTreeWorker.__init__`` all run inside it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

DDTREE = "DDTREE"
DEFAULT_BUDGET = 32
MAX_BUDGET = 1024
# What DFlash's start-up checks raise (AttributeError: a target model without DFlash's layer
# capture, e.g. kimi_k25.py).
_RENAMED = (ValueError, RuntimeError, AttributeError)


@contextlib.contextmanager
def ddtree_named(args: Any) -> Iterator[None]:
    """A refusal naming DFLASH alone, raised for a DDTREE server (DFlash's own checks, which
    DDTREE runs too), is raised again naming DDTREE: same type, same text otherwise, the same
    traceback. Only the plain types SGLang refuses with (a subclass may take other arguments
    than its text)."""
    try:
        yield
    except _RENAMED as exc:
        text = str(exc)
        if getattr(args, "speculative_algorithm", None) != DDTREE or "DFLASH" not in text \
                or DDTREE in text or type(exc) not in _RENAMED:
            raise
        # the same exception, its text renamed: its traceback (ending where the check raised),
        # its cause and its attributes (an AttributeError's name and obj) kept
        exc.args = tuple(a.replace("DFLASH", DDTREE) if isinstance(a, str) else a
                         for a in exc.args)
        raise


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


_BACKEND_FIELDS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


def _refuse_non_triton(args: Any) -> None:
    chosen = {name: getattr(args, name, None) for name in _BACKEND_FIELDS}
    others = {name: value for name, value in chosen.items() if value and value != "triton"}
    if others:
        listed = ", ".join(f"{k}={v}" for k, v in sorted(others.items()))
        raise ValueError(
            "DDTREE full-tree verification needs the triton attention backend, got "
            f"{listed}. Use --attention-backend triton (or name no backend), or add "
            "--speculative-ddtree-shadow-linear to verify the linear chain only."
        )


def choose_ddtree_attention_backend(args: Any) -> None:
    """Run first in ``ServerArgs.__post_init__`` (before SGLang fills in default backends).

    Full-tree mode: no backend named -> triton; a named non-triton backend -> ``ValueError``.
    Shadow-linear mode and other algorithms: nothing.
    """
    if getattr(args, "speculative_algorithm", None) != DDTREE:
        return
    if bool(getattr(args, "speculative_ddtree_shadow_linear", False)):
        return
    _refuse_non_triton(args)
    if not any(getattr(args, name, None) for name in _BACKEND_FIELDS):
        args.attention_backend = "triton"
        logger.info("DDTREE full-tree mode: no attention backend named, using triton.")


def draft_tokens_per_round(args: Any) -> int:
    """Draft tokens a round can accept: the block minus its root, for DFLASH and DDTREE alike.

    SGLang's accept rate divides accepted drafts by ``speculative_num_draft_tokens - 1``; for
    DDTREE that field is the verify width (budget + 1), so the rate would divide by the budget
    although at most ``block - 1`` drafts can be accepted in a round. The patched metrics use this.
    """
    if getattr(args, "speculative_algorithm", None) == DDTREE and getattr(
        args, "speculative_dflash_block_size", None
    ):
        return int(args.speculative_dflash_block_size) - 1
    if args.speculative_num_draft_tokens:
        return int(args.speculative_num_draft_tokens) - 1
    return int(getattr(args, "speculative_num_steps", 0) or 0)


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
            "DDTREE verifies exactly (greedy: the target's argmax; sampled: the target's own "
            "sample at each tree node); relaxed thresholds would change the output "
            "distribution: leave --speculative-accept-threshold-single/-acc at 1.0."
        )
    if getattr(args, "enable_deterministic_inference", False):
        raise ValueError(
            "DDTREE does not support --enable-deterministic-inference: there a request's "
            "sampling_seed picks its tokens, and DDTREE draws each tree node's sample itself, so "
            "a seeded request would get other tokens than without speculative decoding "
            "(docs/request-parameters.md). Drop the flag or the speculative algorithm."
        )
    # DFlash's checks set this; an explicit overlap request cannot be honoured.
    if not args.disable_overlap_schedule:
        raise ValueError("DDTREE does not support overlap scheduling; drop the overlap flags.")

    if not shadow:
        # Normally settled by choose_ddtree_attention_backend; checked again in case a later
        # step of ServerArgs set a backend (e.g. a model-specific default).
        _refuse_non_triton(args)
        if not any(getattr(args, name, None) for name in _BACKEND_FIELDS):
            args.attention_backend = "triton"

    block = args.speculative_num_draft_tokens
    if block is None or int(block) < 2:
        raise ValueError(f"DDTREE needs a draft block of at least 2 tokens, got {block}.")
    block = int(block)
    if not shadow and budget + 1 < block:
        raise ValueError(
            f"DDTREE --speculative-ddtree-budget {budget} is too small for the drafter's block of "
            f"{block} tokens: the verify width (budget + 1 = {budget + 1}) must hold the block. "
            f"Use --speculative-ddtree-budget {block - 1} or more (each extra node costs one KV "
            "slot per request per round and widens the CUDA-graph verify batch)."
        )
    args.speculative_dflash_block_size = block
    args.speculative_num_draft_tokens = block if shadow else budget + 1


def ddtree_draft_block_size(args: Any) -> int:
    """The drafter's block size (root + depths) of a resolved DDTREE ``ServerArgs``."""
    return int(args.speculative_dflash_block_size)
