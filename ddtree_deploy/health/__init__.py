"""Health of a deployed SGLang service: crash signatures and the bounded probe."""

from __future__ import annotations

from ddtree_deploy.health.check import (
    HttpResult,
    ProbeTarget,
    UnitState,
    Verdict,
    judge_generation,
    probe_service,
)
from ddtree_deploy.health.signatures import SIGNATURES, Match, Signature, match_line, scan

__all__ = [
    "SIGNATURES",
    "HttpResult",
    "Match",
    "ProbeTarget",
    "Signature",
    "UnitState",
    "Verdict",
    "judge_generation",
    "match_line",
    "probe_service",
    "scan",
]
