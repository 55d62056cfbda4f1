"""DDTree core for SGLang: tree build, compile and greedy walk (see ``core``)."""

from .core import (
    DDTree,
    VerifyInputs,
    WalkResult,
    ancestor_mask,
    build_tree,
    compile_tree,
    draft_topk,
    walk_tree,
)

__all__ = [
    "DDTree",
    "VerifyInputs",
    "WalkResult",
    "ancestor_mask",
    "build_tree",
    "compile_tree",
    "draft_topk",
    "walk_tree",
]
