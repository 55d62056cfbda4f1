"""A venv's manifest from its RECORDs: the workstation side of remote/overlay_manifest.py.

The script goes to the host on stdin and runs with the venv's own python in one round trip;
its JSON answer becomes a VenvManifest, its errors a RemoteCommandError.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ddtree_deploy.errors import RemoteCommandError
from ddtree_deploy.overlay.model import VenvManifest
from ddtree_deploy.remote.bundle import text
from ddtree_deploy.remote.runner import run_json
from ddtree_deploy.transport.base import Transport
from ddtree_deploy.transport.command import Command

SCRIPT = "overlay_manifest.py"


@dataclass
class ManifestReport:
    """A venv's manifest and, after --verify, the files that no longer match RECORD."""

    manifest: VenvManifest
    mismatches: dict[str, list[str]] = field(default_factory=dict)


def manifest_command(
    venv: str,
    patterns: list[str],
    *,
    verify: bool = False,
    site_packages: str | None = None,
    python: str | None = None,
) -> Command:
    """``<venv>/bin/python - --venv V [--verify] -- PATTERN...`` with the script on stdin."""
    args = ["--venv", venv]
    if site_packages:
        args += ["--site-packages", site_packages]
    if verify:
        args.append("--verify")
    exe = python or posixpath.join(venv, "bin", "python")
    return Command(argv=(exe, "-", *args, "--", *patterns), stdin=text(SCRIPT).encode())


def parse_manifest(host: str, data: dict[str, Any]) -> ManifestReport:
    """The script's JSON answer -> ManifestReport; its errors become a RemoteCommandError."""
    try:
        manifest = VenvManifest.model_validate(data)
    except ValidationError as exc:
        raise RemoteCommandError(f"{host}: the manifest script answered a manifest of the "
                                 f"wrong form ({exc})") from None
    errors = [str(e) for e in data.get("errors") or []]
    if errors:
        shown = "\n  ".join(errors[:20])
        raise RemoteCommandError(f"{host}: cannot read the venv {manifest.venv}:\n  {shown}")
    raw = data.get("mismatches") or {}
    mismatches = {str(k): [str(x) for x in v] for k, v in raw.items()}
    return ManifestReport(manifest=manifest, mismatches=mismatches)


def read_manifest(
    transport: Transport,
    venv: str,
    patterns: list[str],
    *,
    verify: bool = False,
    site_packages: str | None = None,
    python: str | None = None,
    timeout: float = 600.0,
) -> ManifestReport:
    """Run the script on the transport's host in one round trip and parse its answer."""
    cmd = manifest_command(venv, patterns, verify=verify, site_packages=site_packages,
                           python=python)
    data = run_json(transport, cmd, timeout=timeout, what="the manifest script",
                    hint=f"is {venv} a venv on {transport.host}?")
    return parse_manifest(transport.host, data)
