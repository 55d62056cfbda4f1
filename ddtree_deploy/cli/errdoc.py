"""The JSON a command prints on stdout when it fails under --json (schema 1):

    {"ok": false,
     "error": {"message": str, "hint": str | null, "file": str | null, "line": int | null},
     "exit_code": int, "schema": 1}

for the tool's own errors (a DeployError) and for usage errors typer finds (an unknown option,
a missing argument, a bad value), so a machine reading stdout under --json always gets one
object of one shape. The same text also goes to stderr for a person.
"""

from __future__ import annotations

import json
import re
from typing import Any

SCHEMA = 1
# "hosts.yaml:14: hosts.ct200.port: ..." (yamlload.Problem.render): where a config error is
_WHERE = re.compile(r"(?P<file>[^\s:][^:\n]*):(?P<line>\d+): ")


def document(message: str, code: int, *, hint: str | None = None) -> dict[str, Any]:
    where = _WHERE.match(message)
    return {
        "ok": False,
        "error": {
            "message": message,
            "hint": hint,
            "file": where.group("file") if where else None,
            "line": int(where.group("line")) if where else None,
        },
        "exit_code": code,
        "schema": SCHEMA,
    }


def of_error(exc: Exception, code: int) -> dict[str, Any]:
    """A DeployError's document: its message and hint apart (str() glues them)."""
    return document(str(getattr(exc, "message", exc)), code, hint=getattr(exc, "hint", None))


def of_usage(exc: Any) -> dict[str, Any]:
    """A click/typer usage error's document (exit 2; 1 for other click errors)."""
    ctx = getattr(exc, "ctx", None)
    hint = f"Try '{ctx.command_path} --help' for help." if ctx is not None else None
    return document(exc.format_message(), int(getattr(exc, "exit_code", 2)), hint=hint)


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"
