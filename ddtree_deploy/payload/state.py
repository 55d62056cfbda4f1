"""What the payload tool reads back from a host, validated like any input.

`call` runs one op of the host-side script (remote/payload.py) in the venv's python and checks its
answer is the script's JSON; `parse_state` checks the venv's payload.json (a mapping with
the keys a deploy writes, names and paths of the right form). Anything else is refused with
the host, the venv and what was wrong (exit 2), never a traceback.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from ddtree_deploy.errors import ExitCode, RefusedError, RemoteCommandError
from ddtree_deploy.payload.manifest import PACKAGE, check_name, check_rel, check_sha
from ddtree_deploy.remote.bundle import Bundle
from ddtree_deploy.remote.payload_fs import STATE_DIR
from ddtree_deploy.remote.runner import (
    RemoteScriptError,
    RemoteScriptTimeout,
    run_json,
)
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport


class PayloadRefused(RefusedError):
    """Refused: a path that leaves the venv or package, a host answer or state of the wrong
    form (a usage error: exit 2)."""

    exit_code = ExitCode.USAGE


def python_of(venv: str) -> str:
    return f"{venv.rstrip('/')}/bin/python"


def state_path(venv: str) -> str:
    return f"{venv.rstrip('/')}/{STATE_DIR}/payload.json"


SCRIPT = Bundle("payload tool", ("payload_fs.py", "payload_venv.py", "payload_backup.py",
                                  "payload_plugin.py", "payload.py"))


def request(venv: str, op: str, **req: Any) -> bytes:
    """The request line the host-side script reads first from its stdin."""
    return (json.dumps({"op": op, "venv": venv.rstrip("/") or "/", **req}) + "\n").encode()


def command(venv: str, stdin: bytes | None = None) -> Command:
    """The venv's own python running the host-side script (`-I -c`: nothing of the host's
    current folder or environment imported); its request comes on stdin."""
    return Command((python_of(venv), "-I", "-B", "-c", SCRIPT.source()), stdin=stdin)


def _shown(text: str, limit: int = 200) -> str:
    """Host text in a message: quoted, control characters escaped, bounded."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def call(t: ExecTransport, venv: str, op: str, timeout: float = 120, **req: Any
         ) -> dict[str, Any]:
    python = python_of(venv)
    cmd = command(venv, request(venv, op, **req))
    try:
        doc = run_json(t, cmd, timeout=timeout, what="the payload tool", answers=None)
    except RemoteScriptTimeout:
        raise
    except RemoteScriptError as exc:
        r = exc.result
        if r is not None and (r.exit_code == 127 or (not r.stdout and "No such file" in r.stderr)):
            raise PayloadRefused(f"{venv} on {t.host} is not a venv (no {python})") from None
        doc = None
        said = (r.stdout.strip() or r.stderr.strip() or f"exit code {r.exit_code}") if r else ""
    else:
        said = json.dumps(doc)
    if not isinstance(doc, dict) or doc.get("ddtree_payload") != 1 \
            or not isinstance(doc.get("result"), dict):
        raise PayloadRefused(f"{venv} on {t.host}: the venv's python did not answer the payload "
                             f"tool's JSON (it said {_shown(said)})")
    out: dict[str, Any] = doc["result"]
    if isinstance(out.get("refused"), str):
        raise PayloadRefused(f"{venv} on {t.host}: refused: {out['refused']}")
    if isinstance(out.get("error"), str):
        raise RemoteCommandError(f"{venv} on {t.host}: payload {op} failed: {out['error']}")
    return out


class PayloadState(BaseModel):
    """The venv's .ddtree-deploy/payload.json (package and digest: absent in states that an
    earlier ddtree-deploy wrote)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    payload: str
    version: str
    sglang: str
    form: Literal["patch", "plugin"] = "patch"
    package: str = "sglang"
    package_dir: str
    backup: str | None = None  # the plugin form keeps no backup (nothing upstream is written)
    dist: str | None = None  # the plugin form: its distribution's name
    deployed_at: float | int = 0
    files: dict[str, str]
    digest: str | None = None

    _n = field_validator("payload", "version", "sglang")(check_name)

    @field_validator("dist")
    @classmethod
    def _dist(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value)

    @model_validator(mode="after")
    def _form(self) -> PayloadState:
        if self.form == "patch" and self.backup is None:
            raise ValueError("a patch-form state names no backup folder")
        if self.form == "plugin" and self.dist is None:
            raise ValueError("a plugin-form state names no distribution")
        return self

    @field_validator("package")
    @classmethod
    def _package(cls, value: str) -> str:
        if not PACKAGE.match(value):
            raise ValueError(f"expected a package name, got {value!r}")
        return value

    @field_validator("package_dir", "backup")
    @classmethod
    def _abs(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.startswith("/") or "\0" in value:
            raise ValueError(f"expected an absolute path, got {value!r}")
        return value

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        for rel, digest in value.items():
            check_rel(rel)
            check_sha(digest)
        return value


def parse_state(found: dict[str, Any], venv: str, host: str) -> PayloadState | None:
    where = f"{state_path(venv)} on {host}"
    if found.get("state_error"):
        raise PayloadRefused(f"{where}: {found['state_error']}")
    text = found.get("state")
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PayloadRefused(f"{where} is not JSON ({exc.msg} at line {exc.lineno})",
                             hint="restore it, or remove it after putting the upstream "
                                  "files back by hand") from None
    if not isinstance(doc, dict):
        raise PayloadRefused(f"{where}: expected a mapping, got a JSON {type(doc).__name__}")
    try:
        return PayloadState.model_validate(doc)
    except ValidationError as exc:
        why = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'state'}: "
                        f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise PayloadRefused(f"{where} is not a payload state: {why}") from None
