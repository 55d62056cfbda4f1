"""Venv roles, enforced: a write into a `source` or `training` venv is refused.

hosts.yaml says what each venv is for. A `source` venv ("the stack we copy from; never
modified") and a `training` one ("someone trains here: leave it alone") may be read, served
from and cloned FROM, never written INTO (packages, a CUDA lane, the payload, a clone into its
path) unless the venv says `allow_writes: true`. plan refuses such a deployment, and the
commands that write into a venv directly (payload, overlay, venv clone) refuse such a target.
"""

from __future__ import annotations

import posixpath

from ddtree_deploy.config.schema import HostSpec, VenvSpec
from ddtree_deploy.errors import RefusedError


def declared_venv(host: HostSpec, path: str) -> tuple[str, VenvSpec] | None:
    """The venv of the hosts file at `path` on `host` (name and spec), if one is declared."""
    want = posixpath.normpath(path)
    for name, spec in host.venvs.items():
        if posixpath.normpath(str(spec.path)) == want:
            return name, spec
    return None


def refuse_write(host: HostSpec, path: str, what: str) -> None:
    """RefusedError when `path` is a protected venv of `host`; `what` says the writes."""
    found = declared_venv(host, path)
    if found is None or not found[1].protected:
        return
    name, spec = found
    raise RefusedError(
        f"{host.name}: {what} would write into venv {path}, whose role is {spec.role} "
        f"(hosts.{host.name}.venvs.{name}): the tool does not write into a source or "
        "training venv",
        hint=f"serve from a venv of role serving made from it (venvs.NEW: {{path: ..., "
             f"role: serving, create: {{clone: {name}}}}}) or, to write into it anyway, set "
             f"hosts.{host.name}.venvs.{name}.allow_writes: true")
