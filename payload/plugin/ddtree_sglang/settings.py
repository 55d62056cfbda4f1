"""DDTREE's settings on SGLang 0.5.17+: environment variables (SGLang has no hook for new flags).

| variable | value | default |
|---|---|---|
| ``SGLANG_DDTREE_BUDGET`` | tree nodes verified per round, 1-1024 | 32 |
| ``SGLANG_DDTREE_TOPK`` | candidates per depth, 1-1024 | the budget |
| ``SGLANG_DDTREE_SHADOW_LINEAR`` | ``1``: build and score the tree, verify the chain | off |

A value that is not an integer in range is refused at start with the variable's name. The
0.5.11 patch set takes the same settings as ``--speculative-ddtree-*`` flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

BUDGET, TOPK = "SGLANG_DDTREE_BUDGET", "SGLANG_DDTREE_TOPK"
SHADOW_LINEAR = "SGLANG_DDTREE_SHADOW_LINEAR"
DEFAULT_BUDGET = 32
MAX_BUDGET = 1024
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    budget: int
    topk: int
    shadow_linear: bool

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


def from_env(env: Mapping[str, str]) -> Settings:
    """The settings in ``env`` (``os.environ``), checked; ``ValueError`` names the variable."""
    budget = _int(env, BUDGET, DEFAULT_BUDGET)
    topk = _int(env, TOPK, budget)
    raw = env.get(SHADOW_LINEAR, "").strip().lower()
    if raw not in _TRUE + _FALSE:
        raise ValueError(f"DDTREE: {SHADOW_LINEAR} must be 1 or 0, got {raw!r}.")
    return Settings(budget=budget, topk=topk, shadow_linear=raw in _TRUE)
