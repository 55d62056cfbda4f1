"""What a payload command reports: its action on the venv and each check's result."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepResult:
    name: str
    mode: str
    status: str  # passed | failed | skipped
    detail: str


@dataclass
class Outcome:
    venv: str
    action: str  # deployed | upgraded | repaired | unchanged | rolled back | nothing to ...
    sglang: str | None = None
    payload: str | None = None
    checks: list[StepResult] = field(default_factory=list)
    previous: str | None = None  # upgraded: the version that was there
    notes: list[str] = field(default_factory=list)  # what the lock found and undid
    form: str = "patch"  # patch | plugin
