"""A finding: what a rule says about the facts, with the evidence and the remedy.

The remedy texts name the ddtree-deploy commands (or flags) that fix a problem; they are
written here, in one place, so a renamed command is changed once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


class Finding(BaseModel):
    """One diagnosis. ``id`` is stable (scripts match on it); the message may change."""

    model_config = ConfigDict(frozen=True)

    id: str
    severity: Severity
    message: str
    evidence: dict[str, Any] = Field(default_factory=dict)  # the fact values that triggered it
    remedy: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "evidence": self.evidence,
            "remedy": self.remedy,
        }


def sort_key(finding: Finding) -> tuple[int, str, str]:
    evidence = json.dumps(finding.evidence, sort_keys=True, default=str)
    return SEVERITY_ORDER[finding.severity], finding.id, evidence


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Error first, then warning, then info; by id, then by evidence: deterministic."""
    return sorted(findings, key=sort_key)


def has_error(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


# ---- remedies: the commands of the tool (some arrive in later issues; named as designed)

TOOL = "ddtree-deploy"


def overlay(host: str, lane: str, venv: str) -> str:
    return f"`{TOOL} overlay {host} --abi {lane} --venv {venv}`"


def payload_deploy(host: str, venv: str) -> str:
    return f"`{TOOL} payload deploy {host} --venv {venv}`"


def service_up(host: str, name: str, flag: str) -> str:
    return f"`{TOOL} service up {host} {name} {flag}`"


def apply(host: str, deployment: str | None) -> str:
    if deployment:
        return f"`{TOOL} apply {host} --deployment {deployment}`"
    return f"`{TOOL} apply {host}`"


def install(host: str, requirement: str, deployment: str | None) -> str:
    """Installing a package is apply's job: it runs ``uv pip install`` in the venv."""
    return (
        f"add '{requirement}' to the deployment's sglang.extra_packages and run "
        f"{apply(host, deployment)} (it runs `uv pip install '{requirement}'` in the venv)"
    )


def venv_clone(host: str, name: str, source: str) -> str:
    return f"`{TOOL} venv clone {host} {name} --from {source}`"
