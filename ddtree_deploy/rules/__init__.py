"""Rules: pure functions over facts (and a deployment's needs) that return findings.

``diagnose(facts, venv=..., deployment=..., model_facts=...)`` runs them all; ``lane(venv)``
tells a venv's CUDA lane from torch and its shared objects. Version floors and pins are
data in ``floors``, each with its source.
"""

from ddtree_deploy.rules.engine import diagnose, exit_code
from ddtree_deploy.rules.findings import Finding, Severity, has_error, sort_findings
from ddtree_deploy.rules.model_fit import ModelFacts, check_model_fit, expected_width
from ddtree_deploy.rules.venv_lane import LaneReport, lane, lane_from_cuda, lane_major

__all__ = [
    "Finding", "LaneReport", "ModelFacts", "Severity", "check_model_fit", "diagnose",
    "exit_code", "expected_width", "has_error", "lane", "lane_from_cuda", "lane_major",
    "sort_findings",
]  # fmt: skip
