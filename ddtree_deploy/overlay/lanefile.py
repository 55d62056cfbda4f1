"""Lane files (overlays/<lane>.yaml): which distributions form a CUDA lane, what it supersedes.

A lane names its distributions by canonical name or fnmatch pattern
(``nvidia-cu*``), the distributions it supersedes on the target (``nvidia-*-cu12``
when the cu130 lane goes in), where it comes from (host and venv, which
``--from``/``--from-venv`` override) and the checks run in the target venv after
the swap. Loaded with hosts.yaml's quality of errors: ``file:line: field: message``.

Matching rules (used by the plan):

- a distribution is *in the lane* when it matches ``distributions`` and no ``exclude``;
- every name in ``required`` must be in the source's lane (else the plan stops);
- a target distribution that is in the lane or matches ``supersedes`` and that the
  source's lane lacks is removed.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ddtree_deploy.config.schema import quoted_text
from ddtree_deploy.config.yamlload import Problem, load_yaml_file, render_problems
from ddtree_deploy.config.yamlmodel import load_model
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.remote.facts_parse import canonical_name
from ddtree_deploy.resources import data_path

LANE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
HOST_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
PATTERN_RE = re.compile(r"[A-Za-z0-9._*?\[\]!-]+\Z")
MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
CUDA_RE = re.compile(r"\d{1,2}\.\d{1,2}\Z")
GLOB_CHARS = frozenset("*?[")


def is_glob(pattern: str) -> bool:
    return any(c in GLOB_CHARS for c in pattern)


def _pattern(value: str) -> str:
    if not PATTERN_RE.match(value):
        raise ValueError(
            "expected a distribution name or fnmatch pattern "
            "(letters, digits, '.', '_', '-', '*', '?', '[...]')"
        )
    if value.count("[") != value.count("]"):
        raise ValueError("unbalanced '[' ']' in pattern")
    return canonical_name(value)


def _lane_name(value: str) -> str:
    if not LANE_NAME_RE.match(value):
        raise ValueError("expected a lane name such as cu130 (lower case, digits, '.', '_', '-')")
    return value


def _host(value: str) -> str:
    if not HOST_NAME_RE.match(value):
        raise ValueError("expected a host name from hosts.yaml (lower case, digits, '.', '_', '-')")
    return value


def _abs_path(value: str) -> str:
    if not value.startswith("/"):
        hint = " ('~' is not expanded for paths on a host)" if value.startswith("~") else ""
        raise ValueError(f"expected an absolute path on the host{hint}")
    if "\0" in value or "\n" in value:
        raise ValueError("expected a path without NUL or newline")
    return value.rstrip("/") or "/"


def _cuda(value: str) -> str:
    if not CUDA_RE.match(value):
        raise ValueError('expected a CUDA version such as "13.0"')
    return value


def _module(value: str) -> str:
    if not MODULE_RE.match(value):
        raise ValueError("expected a Python module name such as sgl_kernel")
    return value


def _non_empty(value: list[str]) -> list[str]:
    if not value:
        raise ValueError("expected at least one distribution name or pattern")
    return value


def _major(value: int) -> int:
    if not 9 <= value <= 99:
        raise ValueError("must be a CUDA major version, 9-99")
    return value


Pattern = Annotated[
    str, BeforeValidator(quoted_text("a distribution name")), AfterValidator(_pattern)
]
ModuleName = Annotated[str, BeforeValidator(quoted_text("a module name")), AfterValidator(_module)]


class LaneSource(BaseModel):
    """Where the lane's distributions come from by default."""

    model_config = ConfigDict(extra="forbid", strict=True)
    host: Annotated[str, BeforeValidator(quoted_text("a host name")), AfterValidator(_host)]
    venv: Annotated[
        str, BeforeValidator(quoted_text("an absolute path")), AfterValidator(_abs_path)
    ]


class LaneChecks(BaseModel):
    """Checks run with the target venv's python after the swap (executed by overlay.apply)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    torch_cuda: (
        Annotated[str, BeforeValidator(quoted_text("a CUDA version")), AfterValidator(_cuda)] | None
    ) = None  # torch.version.cuda must equal this
    extension_cudart_major: Annotated[int, AfterValidator(_major)] | None = None
    # every shared object of the lane that needs libcudart.so.N must have N == this
    imports: list[ModuleName] = Field(default_factory=list)  # each must import


class Lane(BaseModel):
    """One lane file."""

    model_config = ConfigDict(extra="forbid", strict=True)
    lane: Annotated[str, BeforeValidator(quoted_text("a lane name")), AfterValidator(_lane_name)]
    description: str = ""
    source: LaneSource
    distributions: Annotated[list[Pattern], AfterValidator(_non_empty)]
    required: list[Pattern] = Field(default_factory=list)
    exclude: list[Pattern] = Field(default_factory=list)
    supersedes: list[Pattern] = Field(default_factory=list)
    checks: LaneChecks = Field(default_factory=LaneChecks)

    def includes(self, name: str) -> bool:
        """Whether the distribution ``name`` is part of this lane."""
        name = canonical_name(name)
        return _any(name, self.distributions) and not _any(name, self.exclude)

    def supersedes_name(self, name: str) -> bool:
        """Whether ``name`` on the target gives way to this lane (removed when absent from it)."""
        return _any(canonical_name(name), self.supersedes)

    def source_patterns(self) -> list[str]:
        """Patterns for the source's manifest."""
        return list(self.distributions)

    def target_patterns(self) -> list[str]:
        """Patterns for the target's manifest (the lane and what it supersedes)."""
        return list(dict.fromkeys([*self.distributions, *self.supersedes]))

    def with_source(self, host: str | None = None, venv: str | None = None) -> Lane:
        """A copy with ``--from HOST`` / ``--from-venv PATH`` applied (validated the same way)."""
        data = self.source.model_dump()
        if host is not None:
            data["host"] = host
        if venv is not None:
            data["venv"] = venv
        try:
            source = LaneSource.model_validate(data)
        except ValueError as exc:
            errors = getattr(exc, "errors", None)
            first = errors()[0] if callable(errors) else {}
            field = ".".join(str(p) for p in first.get("loc", ()))
            msg = str(first.get("ctx", {}).get("error", first.get("msg", exc)))
            raise ConfigError(f"--from{'-venv' if field == 'venv' else ''}: {msg}") from None
        return self.model_copy(update={"source": source})


def _any(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _cross_check(lane: Lane, path: Path) -> None:
    """Checks across fields, each reported at the line of the item at fault."""
    doc = load_yaml_file(path)
    problems: list[Problem] = []
    if lane.lane != path.stem and path.suffix in (".yaml", ".yml"):
        problems.append(Problem(doc.line_of(("lane",)), ("lane",),
                                f"'{lane.lane}' differs from the file name '{path.name}'"))
    for field in ("distributions", "required", "exclude", "supersedes"):
        seen: dict[str, int] = {}
        for i, pattern in enumerate(getattr(lane, field)):
            line = doc.line_of((field, i))
            if pattern in seen:
                first = seen[pattern]
                problems.append(Problem(line, (field, i),
                                        f"'{pattern}' is listed twice (first on line {first})"))
            seen.setdefault(pattern, line)
    for i, name in enumerate(lane.required):
        loc: tuple[str, int] = ("required", i)
        if is_glob(name):
            problems.append(Problem(doc.line_of(loc), loc,
                                    f"'{name}': expected a distribution name, not a pattern"))
        elif not lane.includes(name):
            problems.append(Problem(doc.line_of(loc), loc,
                                    f"'{name}' is not in the lane (distributions, exclude)"))
    for i, pattern in enumerate(lane.supersedes):
        clash = [n for n in lane.required if fnmatch.fnmatchcase(n, pattern)]
        if clash:
            problems.append(Problem(doc.line_of(("supersedes", i)), ("supersedes", i),
                                    f"'{pattern}' matches {clash[0]}, which the lane installs"))
    checks = lane.checks
    if checks.torch_cuda is not None and checks.extension_cudart_major is not None:
        major = int(checks.torch_cuda.split(".")[0])
        if major != checks.extension_cudart_major:
            where = ("checks", "extension_cudart_major")
            problems.append(Problem(doc.line_of(where), where,
                                    f"{checks.extension_cudart_major} disagrees with torch_cuda "
                                    f"'{checks.torch_cuda}' (major {major})"))
    if problems:
        problems.sort(key=lambda p: (p.line, str(p.path)))
        raise ConfigError(render_problems(problems, str(path)))


def load_lane_file(path: Path) -> Lane:
    """Load and check one lane file; every problem is a ConfigError with file:line."""
    lane = load_model(path, Lane, "an overlay lane")
    _cross_check(lane, path)
    return lane


def lanes_dir() -> Path:
    return data_path("overlays")


def available_lanes() -> list[str]:
    try:
        folder = lanes_dir()
    except FileNotFoundError:
        return []
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_lane(name_or_path: str) -> Lane:
    """A lane by name (``cu130`` -> overlays/cu130.yaml) or by the path of a lane file."""
    if "/" in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        return load_lane_file(Path(name_or_path))
    if not LANE_NAME_RE.match(name_or_path):
        raise ConfigError(f"not a lane name: {name_or_path!r}")
    known = available_lanes()
    if name_or_path not in known:
        listed = ", ".join(known) or "none"
        raise ConfigError(f"no lane {name_or_path!r} (known lanes: {listed})",
                          hint="give a lane name or the path of a lane file")
    return load_lane_file(lanes_dir() / f"{name_or_path}.yaml")
