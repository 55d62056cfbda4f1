"""The --json document every command prints (docs/json.md, cli/errdoc.py) as one schema, for
the tests that read it: `check(text)` parses stdout and validates it, or fails the test.

    {"ok": true,  "results": ...,                                   "exit_code": N, "schema": 1}
    {"ok": false, "error": {"message", "hint", "file", "line"},     "exit_code": N, "schema": 1}

and no time in it is a number: every field that holds a time is ISO-8601 text in UTC.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ErrorObject(_Strict):
    message: str = Field(min_length=1)
    hint: str | None
    file: str | None
    line: int | None


class Success(_Strict):
    ok: Literal[True]
    results: Any
    exit_code: int
    schema_: Literal[1] = Field(alias="schema")


class Failure(_Strict):
    ok: Literal[False]
    error: ErrorObject
    exit_code: int = Field(ge=1)
    schema_: Literal[1] = Field(alias="schema")


Envelope: TypeAdapter[Success | Failure] = TypeAdapter(Success | Failure)

# fields of the tool's results that hold a time (the plan's, facts', payload states',
# overlay history entries')
TIME_FIELDS = frozenset({"time", "created", "started", "at"})


def is_time_field(key: str) -> bool:
    return key in TIME_FIELDS or key.endswith("_at")


def times_in(value: Any, where: str = "results") -> list[tuple[str, Any]]:
    """Every (path, value) of a time field in `value`; the facts_at kind (a map of times by
    host) counts each of its values."""
    found: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{where}.{k}"
            if is_time_field(str(k)):
                if isinstance(v, dict):
                    found += [(f"{path}.{h}", t) for h, t in v.items()]
                else:
                    found.append((path, v))
            found += times_in(v, path)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += times_in(v, f"{where}[{i}]")
    return found


def check_times(results: Any) -> None:
    """Every time is ISO-8601 text with a UTC offset (None: unknown); never an epoch number."""
    for path, value in times_in(results):
        if value is None:
            continue
        assert isinstance(value, str), f"{path}: {value!r} is not ISO-8601 text"
        when = datetime.datetime.fromisoformat(value)
        assert when.utcoffset() == datetime.timedelta(0), f"{path}: {value!r} is not UTC"


def check(text: str, exit_code: int) -> Success | Failure:
    """stdout of a --json run: exactly one document of the schema, whose exit_code is the
    process's, and whose times are text."""
    doc = Envelope.validate_python(json.loads(text))
    assert doc.exit_code == exit_code, (doc.exit_code, exit_code)
    if isinstance(doc, Success):
        check_times(doc.results)
    return doc
