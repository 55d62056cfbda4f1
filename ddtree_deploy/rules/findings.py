"""A finding: what a rule says about the facts, with the evidence and the remedy.

The remedy texts name the ddtree-deploy commands (or flags) that fix a problem; they are
written here, in one place, so a renamed command is changed once.
"""

from __future__ import annotations

import json
import re
import shlex
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
            "commands": commands_of(self.remedy),
        }


def sort_key(finding: Finding) -> tuple[int, str, str]:
    evidence = json.dumps(finding.evidence, sort_keys=True, default=str)
    return SEVERITY_ORDER[finding.severity], finding.id, evidence


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Error first, then warning, then info; by id, then by evidence: deterministic."""
    return sorted(findings, key=sort_key)


def has_error(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


# ---- remedies: the commands of the tool, built here (one place), each one a command line the
# CLI parses as it stands (tests/test_remedies.py parses every one with the real parser). A
# value the rule cannot know is an upper-case placeholder the user fills in (HOST, NAME, N).

TOOL = "ddtree-deploy"
_COMMAND = re.compile(r"`(" + TOOL + r" [^`]*)`")
_SAFE = re.compile(r"[A-Za-z0-9_./:=@%+,{}\-]+")


def _arg(value: str) -> str:
    return value if _SAFE.fullmatch(value) else shlex.quote(value)


def command(*argv: str) -> str:
    """A ddtree-deploy command line in backquotes, as the remedies print it."""
    return "`" + " ".join([TOOL, *(_arg(a) for a in argv)]) + "`"


def commands_of(text: str) -> list[str]:
    """Every ddtree-deploy command line a remedy names, in order (its own field in --json)."""
    return _COMMAND.findall(text)


def overlay(host: str, lane: str, venv: str) -> str:
    return command("overlay", "--abi", lane, "--to", host, "--venv", venv)


def payload_deploy(host: str, venv: str) -> str:
    return command("payload", "deploy", host, "--venv", venv)


def service_up(host: str, name: str | None, *flags: str) -> str:
    """`service up HOST NAME FLAG...`; ``flags`` may hold several words ("--gpu 1")."""
    return command("service", "up", host, name or "NAME",
                   *(word for flag in flags for word in flag.split()))


def apply(host: str, deployment: str | None = None) -> str:
    """apply converges every deployment of the host (it has no option to pick one)."""
    return command("apply", host)


def doctor(host: str, *argv: str) -> str:
    return command("doctor", host, *argv)


def inventory(host: str) -> str:
    return command("inventory", host)


def install(host: str, requirement: str, deployment: str | None) -> str:
    """Installing a package is apply's job: it runs ``uv pip install`` in the venv."""
    where = f"deployment {deployment}'s" if deployment else "the deployment's"
    return (
        f"add '{requirement}' to {where} sglang.extra_packages and run "
        f"{apply(host, deployment)} (it runs `uv pip install '{requirement}'` in the venv)"
    )


def venv_clone(host: str, source: str, destination: str) -> str:
    return command("venv", "clone", host, source, destination)
