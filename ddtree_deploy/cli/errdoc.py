"""The one JSON document a command prints on stdout under --json (schema 1; docs/json.md).

A success (the command did its work and reports it; `exit_code` is its verdict: 0, or 4 for
plan's pending changes, 3 when some hosts failed, 1 for a failed check or an unhealthy
service):

    {"ok": true, "results": <the command's data>, "exit_code": int, "schema": 1}

A failure (the command stopped on an error: the tool's own, a DeployError, or a usage error
typer finds: an unknown option, a missing argument, a bad value):

    {"ok": false,
     "error": {"message": str, "hint": str | null, "file": str | null, "line": int | null},
     "exit_code": int, "schema": 1}

so a machine reading stdout under --json always gets one object of one shape, and `exit_code`
is always the process's. The error's text also goes to stderr for a person. A host that failed
inside a multi-host command's results is the same `error` object, beside its host's name.
"""

from __future__ import annotations

import json
import re
from typing import Any

SCHEMA = 1
# "hosts.yaml:14: hosts.ct200.port: ..." (yamlload.Problem.render): where a config error is
_WHERE = re.compile(r"(?P<file>[^\s:][^:\n]*):(?P<line>\d+): ")


def error_of(message: str, hint: str | None = None) -> dict[str, Any]:
    """The `error` object: the message, its hint apart, and the file and line it names."""
    where = _WHERE.match(message)
    return {
        "message": message,
        "hint": hint,
        "file": where.group("file") if where else None,
        "line": int(where.group("line")) if where else None,
    }


def exc_error(exc: Exception) -> dict[str, Any]:
    """A DeployError's `error` object: its message and hint apart (str() glues them)."""
    return error_of(str(getattr(exc, "message", exc)), getattr(exc, "hint", None))


def document(message: str, code: int, *, hint: str | None = None) -> dict[str, Any]:
    return {"ok": False, "error": error_of(message, hint), "exit_code": code, "schema": SCHEMA}


def success(results: Any, code: int = 0) -> dict[str, Any]:
    """A success's document: the command's results and its exit code."""
    return {"ok": True, "results": results, "exit_code": int(code), "schema": SCHEMA}


def of_error(exc: Exception, code: int) -> dict[str, Any]:
    """A DeployError's document."""
    return {"ok": False, "error": exc_error(exc), "exit_code": code, "schema": SCHEMA}


def of_usage(exc: Any) -> dict[str, Any]:
    """A click/typer usage error's document (exit 2; 1 for other click errors)."""
    ctx = getattr(exc, "ctx", None)
    hint = f"Try '{ctx.command_path} --help' for help." if ctx is not None else None
    return document(exc.format_message(), int(getattr(exc, "exit_code", 2)), hint=hint)


def dumps(doc: dict[str, Any]) -> str:
    """The document as printed: ASCII only (ensure_ascii), so every control character and
    bidirectional override in host text is a ``\\uNNNN`` escape, never raw."""
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"
