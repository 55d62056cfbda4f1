"""SYNTHETIC speed and acceptance of the stand-in server: made-up functions, no model runs.

Nothing here was measured: the numbers only have the shapes a bench sweep must be able to
see, so that the sweep's mechanics (restart per configuration, metrics, report, recommend)
are tested against a server whose answers depend on the flags it was started with:

- a decode round costs a target forward whose price grows with the tokens it verifies
  (batch x verify width) plus the drafter's cost; DDTree adds a tree build growing with
  budget x top-k;
- DFlash accepts a fixed fraction of its block; DDTree's tree accepts more, saturating with
  the budget and growing with top-k, never more than the verify width; shadow-linear
  verifies the chain only (DFlash's acceptance at DDTree's price); sampled requests accept
  less; the prompt (workload) scales acceptance by a deterministic factor in [0.8, 1.2].

At batch 1 this gives about 40 tok/s without speculation, ~160 tok/s with DFlash (block 16)
and ~190 tok/s with DDTree 15/8; the gain shrinks as concurrency grows.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

BASE_ROUND_S = 0.025  # one target forward at batch 1 (synthetic)
PER_TOKEN = 0.0025  # extra forward cost per verified token in the batch (synthetic)
PER_REQUEST = 0.03  # extra cost per additional running request (synthetic)
DRAFT_S = 0.002  # drafter forward per round (synthetic)
TREE_S = 0.00001  # tree build per budget x top-k unit (synthetic)
DFLASH_FRACTION = 0.22  # accepted share of a DFlash block beyond the bonus token (synthetic)
TREE_GAIN = 0.7  # DDTree's best extra acceptance over the chain (synthetic)
SAMPLED_FACTOR = 0.85  # acceptance of temperature > 0 requests relative to greedy (synthetic)


def prompt_factor(key: str) -> float:
    """A deterministic acceptance factor in [0.8, 1.2] for a prompt (stands for its content)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return 0.8 + (int.from_bytes(digest[:2], "big") % 401) / 1000.0


@dataclass(frozen=True)
class SpeedModel:
    algorithm: str = "NONE"  # NONE, DFLASH, DDTREE (others: treated as DFLASH)
    block: int = 16  # drafter block size
    budget: int = 0  # DDTree node budget
    topk: int = 1
    shadow_linear: bool = False

    @property
    def speculative(self) -> bool:
        return self.algorithm != "NONE"

    @property
    def width(self) -> int:
        """Tokens verified per request per round (SGLang's speculative_num_draft_tokens)."""
        if not self.speculative:
            return 1
        if self.algorithm == "DDTREE" and not self.shadow_linear:
            return self.budget + 1
        return self.block

    def round_seconds(self, batch: int) -> float:
        batch = max(1, batch)
        cost = BASE_ROUND_S * (1 + PER_TOKEN * batch * self.width + PER_REQUEST * (batch - 1))
        if self.speculative:
            cost += DRAFT_S
        if self.algorithm == "DDTREE":
            cost += TREE_S * self.budget * self.topk * (1 + 0.1 * (batch - 1))
        return cost

    def accept_length(self, sampled: bool, key: str) -> float:
        """Mean tokens per round (accepted drafts + the bonus token), at least 1."""
        if not self.speculative:
            return 1.0
        chain = 1 + (self.block - 1) * DFLASH_FRACTION
        if self.algorithm == "DDTREE" and not self.shadow_linear:
            saturation = 1 - math.exp(-(self.budget + 1) / self.block)
            breadth = 1 - 1 / max(1, self.topk) ** 0.5
            chain *= 1 + TREE_GAIN * saturation * breadth
        value = chain * prompt_factor(key) * (SAMPLED_FACTOR if sampled else 1.0)
        return max(1.0, min(float(self.width), value))
