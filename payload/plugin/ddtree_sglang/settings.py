"""DDTREE's settings on SGLang 0.5.17+: environment variables (SGLang has no hook for new flags).

| variable | value | default |
|---|---|---|
| ``SGLANG_DDTREE_BUDGET`` | tree nodes verified per round, 1-1024 | 32 |
| ``SGLANG_DDTREE_TOPK`` | candidates per depth, 1-1024 | the budget |
| ``SGLANG_DDTREE_SHADOW_LINEAR`` | ``1``: build and score the tree, verify the chain | off |
| ``SGLANG_DDTREE_TREE_ATTENTION`` | ``0``: SGLang's extend kernel, not the tree kernel | on |
| ``SGLANG_DDTREE_VERIFY_GRAPH`` | ``0``: verify eagerly, not from graphs with the mask | on |

A value that is not an integer in range is refused at start with the variable's name. The
last two are A/B switches of the target's verify (``target_attention``), on by default from
plugin 0.3.4 (opt-in in 0.3.2-0.3.3, until the rehearsal proved them lossless on an H200): an
unset variable is on, ``1`` is on, ``0`` is off (the verify as proven before them: eager,
SGLang's extend kernel), anything else is refused at start. A tree kernel whose start-up check
fails leaves SGLang's kernel serving whatever the switch says. The 0.5.11 patch set takes the
first three as ``--speculative-ddtree-*`` flags and serves its tree kernel by default.
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
class Switch:
    """A proven verify path's A/B switch: on unless its variable says ``0``."""

    name: str
    on: bool = True
    explicit: bool = False  # the variable was set (``0`` or ``1``), not left to the default

    @property
    def why(self) -> str:
        if self.explicit:
            return f"{self.name}={int(self.on)}"
        return f"default; {self.name}=0 turns it off"


@dataclass(frozen=True)
class Settings:
    budget: int
    topk: int
    shadow_linear: bool
    tree_attention: Switch = Switch(TREE_ATTENTION)
    verify_graph: Switch = Switch(VERIFY_GRAPH)

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


def _switch(env: Mapping[str, str], name: str) -> Switch:
    raw = env.get(name, "").strip()
    if raw == "":
        return Switch(name)
    if raw not in ("0", "1"):
        raise ValueError(f"DDTREE: {name} must be 1 (on, the default) or 0 (off), got {raw!r}.")
    return Switch(name, on=raw == "1", explicit=True)


def from_env(env: Mapping[str, str]) -> Settings:
    """The settings in ``env`` (``os.environ``), checked; ``ValueError`` names the variable."""
    budget = _int(env, BUDGET, DEFAULT_BUDGET)
    topk = _int(env, TOPK, budget)
    raw = env.get(SHADOW_LINEAR, "").strip().lower()
    if raw not in _TRUE + _FALSE:
        raise ValueError(f"DDTREE: {SHADOW_LINEAR} must be 1 or 0, got {raw!r}.")
    return Settings(budget=budget, topk=topk, shadow_linear=raw in _TRUE,
                    tree_attention=_switch(env, TREE_ATTENTION),
                    verify_graph=_switch(env, VERIFY_GRAPH))
