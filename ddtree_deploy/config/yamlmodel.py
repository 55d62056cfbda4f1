"""Load a YAML file straight into a pydantic model, with hosts.yaml's quality of errors.

Every problem is reported at once, one line each: `file:line: field.path: what was
expected, what was got` (a ConfigError, exit code 2). Used for data files other
than hosts.yaml (payload.yaml, overlay lanes), which need no cross-reference pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ddtree_deploy.config.yamlload import Problem, load_yaml_file, path_part, render_problems
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.settings.messages import describe, english

M = TypeVar("M", bound=BaseModel)


def load_model(path: Path, model: type[M], what: str) -> M:
    file = str(path)
    if not path.exists():
        raise ConfigError(f"{file}: no such file ({what})")
    doc = load_yaml_file(path)
    if doc.problems:
        raise ConfigError(render_problems(doc.problems, file))
    if not isinstance(doc.data, dict):
        raise ConfigError(f"{file}:{doc.line_of(())}: expected a mapping ({what}), "
                          f"got {describe(doc.data)}")
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(path_part(p) if not isinstance(p, int) else p for p in error["loc"])
            problems.append(Problem(doc.line_of(loc), loc, english(error, model)))
        unique = sorted(set(problems), key=lambda p: (p.line, str(p.path), p.message))
        raise ConfigError(render_problems(unique, file)) from None
