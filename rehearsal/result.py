"""The schema of OUT/rehearsal.json (what ``rehearsal.run`` writes), as pydantic models.

The file is written after every step, so a cut run still validates: every section is optional
beyond ``format`` and ``phase``, and what did not run is listed in ``not_run``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Step(_Open):
    ok: bool
    seconds: float
    error: str | None = None


class ToolCall(_Open):
    exit: int
    seconds: float
    stdout_tail: str = ""
    stderr_tail: str = ""


class ServerRun(_Open):
    port: int = Field(ge=1, le=65535)
    argv: list[str]
    # None: not probed by the tool (``tool_probe=False``: the rehearsal waited for /health and
    # a greedy answer itself, recorded in ``healthy_by``)
    probe_exit: int | None
    probe: dict[str, Any] = Field(default_factory=dict)
    healthy_by: str | None = None
    ready_s: float | None = None


class NotRun(_Open):
    step: str
    why: str


class ErrorNote(_Open):
    step: str
    trace: str


class Lossless(_Open):
    ok: bool
    requests: int
    failed: int
    wrong: int
    max_running_req: int | None = None


class Result(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal[1]
    phase: str  # one phase or several, comma-separated (rehearsal.phases.parse)
    elapsed_s: float | None = None
    sglang: str | None = None  # the release the run served (rehearsal.run --sglang; 0.5.11 before)
    steps: dict[str, Step | ToolCall | str | dict[str, Any]] = Field(default_factory=dict)
    tool: dict[str, ToolCall] = Field(default_factory=dict)
    servers: dict[str, ServerRun] = Field(default_factory=dict)
    # run 4 wrote one check as a list of tries (later runs: {"tries": [...]})
    checks: dict[str, dict[str, Any] | list[Any]] = Field(default_factory=dict)
    perf: dict[str, dict[str, Any]] = Field(default_factory=dict)
    bench: dict[str, Any] | None = None
    profiles: dict[str, dict[str, Any]] | None = None  # perf --profile (rehearsal/profile.py)
    perf8b: dict[str, Any] | None = None  # phase perf-8b (rehearsal/perf8b.py)
    not_run: list[NotRun] = Field(default_factory=list)
    errors: list[ErrorNote] = Field(default_factory=list)

    @field_validator("phase")
    @classmethod
    def _known_phases(cls, value: str) -> str:
        from rehearsal.phases import parse

        if isinstance(parse(value), str):
            raise ValueError(f"not a phase list: {value!r}")
        return value

    def lossless(self) -> dict[str, Lossless]:
        return {k.split("/", 1)[1]: Lossless.model_validate(v) for k, v in self.checks.items()
                if k.startswith("lossless/")}


def load(path: str) -> Result:
    with open(path, encoding="utf-8") as fh:
        return Result.model_validate_json(fh.read())
