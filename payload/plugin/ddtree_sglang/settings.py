"""DDTREE's settings on SGLang 0.5.17+: environment variables (SGLang has no hook for new flags).

| variable | value | default |
|---|---|---|
| ``SGLANG_DDTREE_BUDGET`` | tree nodes verified per round, 1-1024 | 32 |
| ``SGLANG_DDTREE_TOPK`` | candidates per depth, 1-1024 | the budget |
| ``SGLANG_DDTREE_SHADOW_LINEAR`` | ``1``: build and score the tree, verify the chain | off |
| ``SGLANG_DDTREE_TREE_ATTENTION`` | ``1``: the tree verify kernel in front of SGLang's | off |
| ``SGLANG_DDTREE_VERIFY_GRAPH`` | ``1``: the verify replays graphs captured with the mask | off |

A value that is not an integer in range is refused at start with the variable's name. The
last two are opt-ins (``target_attention``): off until a GPU run proves them lossless in the
plugin form (an unset variable is off, ``0`` is off, ``1`` is on, anything else is refused
at start). The 0.5.11 patch set takes the first three as ``--speculative-ddtree-*`` flags
and serves its (proven) tree kernel by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

BUDGET, TOPK = "SGLANG_DDTREE_BUDGET", "SGLANG_DDTREE_TOPK"
SHADOW_LINEAR = "SGLANG_DDTREE_SHADOW_LINEAR"
TREE_ATTENTION, VERIFY_GRAPH = "SGLANG_DDTREE_TREE_ATTENTION", "SGLANG_DDTREE_VERIFY_GRAPH"
DEFAULT_BUDGET = 32
MAX_BUDGET = 1024
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class OptIn:
    """An unproven path's switch: on only where its variable says ``1``."""

    name: str
    on: bool = False
    explicit: bool = False  # the variable was set (``0`` or ``1``), not left to the default

    @property
    def why(self) -> str:
        if self.explicit:
            return f"{self.name}={int(self.on)}"
        return f"default until proven on a GPU; {self.name}=1 turns it on"


@dataclass(frozen=True)
class Settings:
    budget: int
    topk: int
    shadow_linear: bool
    tree_attention: OptIn = OptIn(TREE_ATTENTION)
    verify_graph: OptIn = OptIn(VERIFY_GRAPH)

    @property
    def mode(self) -> str:
        return "shadow-linear" if self.shadow_linear else "full-tree"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"DDTREE: {name} must be an integer 1-{MAX_BUDGET}, got {raw!r}.") from None
    if not 1 <= value <= MAX_BUDGET:
        raise ValueError(f"DDTREE: {name} must be between 1 and {MAX_BUDGET}, got {value}.")
    return value


def _opt_in(env: Mapping[str, str], name: str) -> OptIn:
    raw = env.get(name, "").strip()
    if raw == "":
        return OptIn(name)
    if raw not in ("0", "1"):
        raise ValueError(f"DDTREE: {name} must be 1 (on) or 0 (off, the default), got {raw!r}.")
    return OptIn(name, on=raw == "1", explicit=True)


def from_env(env: Mapping[str, str]) -> Settings:
    """The settings in ``env`` (``os.environ``), checked; ``ValueError`` names the variable."""
    budget = _int(env, BUDGET, DEFAULT_BUDGET)
    topk = _int(env, TOPK, budget)
    raw = env.get(SHADOW_LINEAR, "").strip().lower()
    if raw not in _TRUE + _FALSE:
        raise ValueError(f"DDTREE: {SHADOW_LINEAR} must be 1 or 0, got {raw!r}.")
    return Settings(budget=budget, topk=topk, shadow_linear=raw in _TRUE,
                    tree_attention=_opt_in(env, TREE_ATTENTION),
                    verify_graph=_opt_in(env, VERIFY_GRAPH))
