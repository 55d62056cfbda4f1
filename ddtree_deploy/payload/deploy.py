"""Deploy, verify, roll back and report the payload on a venv of a host.

deploy: the venv's sglang version must be one the manifest supports and every
upstream file it patches must match the manifest's sha256 (else a clear refusal
naming the file); originals are backed up on the host byte for byte; patched and
new files are installed (each written beside its target, then renamed); stale
__pycache__ of touched modules is cleared; then verify runs in the venv's own
python. A failed verify rolls the deploy back. rollback restores the originals and
removes the files the payload added, and clears __pycache__ again.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_deploy.errors import DeployError, RefusedError, RemoteCommandError
from ddtree_deploy.payload.manifest import Manifest, Support
from ddtree_deploy.payload.patching import apply_patch
from ddtree_deploy.payload.remote import CLEAR_PYCACHE, LOCATE, STATE_DIR
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport


@dataclass
class StepResult:
    name: str
    mode: str
    status: str  # passed | failed | skipped
    detail: str


@dataclass
class Outcome:
    venv: str
    action: str  # deployed | unchanged | rolled back | nothing to roll back
    sglang: str | None = None
    payload: str | None = None
    checks: list[StepResult] = field(default_factory=list)


def _python(venv: str) -> str:
    return f"{venv.rstrip('/')}/bin/python"


def locate(t: ExecTransport, venv: str, package: str, rels: list[str]) -> dict[str, Any]:
    r = t.run(Command(argv=(_python(venv), "-", package, STATE_DIR, *rels),
                      stdin=LOCATE.encode()), timeout=60)
    if r.exit_code == 127 or "No such file" in r.stderr and not r.stdout:
        raise RefusedError(f"{venv} on {t.host} is not a venv (no {_python(venv)})")
    r.check()
    found: dict[str, Any] = json.loads(r.stdout)
    return found


def _read(t: ExecTransport, path: str) -> bytes:
    buf = io.BytesIO()
    t.get_stream(path, buf)
    return buf.getvalue()


def _clear_pycache(t: ExecTransport, venv: str, pkg: str, rels: list[str]) -> None:
    t.run(Command(argv=(_python(venv), "-", pkg, *rels), stdin=CLEAR_PYCACHE.encode()),
          timeout=60).check()


def _supported(manifest: Manifest, version: str | None, venv: str, host: str) -> Support:
    if version is None:
        raise RefusedError(f"{venv} on {host} has no sglang installed")
    if version not in manifest.sglang:
        raise RefusedError(
            f"payload {manifest.payload} {manifest.version} does not support sglang {version} "
            f"(in {venv} on {host}); it supports: {', '.join(sorted(manifest.sglang))}"
        )
    return manifest.sglang[version]


def deploy(t: ExecTransport, venv: str, manifest: Manifest, folder: Path) -> Outcome:
    probe = locate(t, venv, "sglang", [])
    support = _supported(manifest, probe["version"], venv, t.host)
    targets = manifest.targets(probe["version"])
    found = locate(t, venv, support.package, targets)
    pkg = found["package_dir"]
    state = found["state"]
    if state and state.get("payload") == manifest.payload:
        if state.get("version") == manifest.version and all(
            found["files"].get(rel) == digest for rel, digest in state["files"].items()
        ):
            out = Outcome(venv, "unchanged", probe["version"], manifest.version)
            out.checks = verify(t, venv, manifest, pkg, torch=found["torch"])
            return out
        raise RefusedError(f"payload {state.get('payload')} {state.get('version')} is already on "
                           f"{venv}; roll it back first (ddtree-deploy payload rollback)")
    for p in support.patches:
        have = found["files"].get(p.target)
        if have != p.sha256:
            raise RefusedError(
                f"{venv} on {t.host}: {support.package}/{p.target} is not the sglang "
                f"{probe['version']} file the payload patches: expected sha256 {p.sha256}, "
                f"found {have or 'no such file'}"
            )
    new: dict[str, bytes] = {}
    for p in support.patches:
        original = _read(t, f"{pkg}/{p.target}").decode()
        patch_text = (folder / p.patch).read_text(encoding="utf-8")
        new[p.target] = apply_patch(original, patch_text, name=p.target).encode()
    for f in support.files:
        new[f.target] = (folder / f.source).read_bytes()
    backup = f"{venv.rstrip('/')}/{STATE_DIR}/backups/{manifest.payload}-{manifest.version}-" \
             f"{time.strftime('%Y%m%dT%H%M%S')}"
    originals = {rel: found["files"].get(rel) for rel in targets}
    script = 'set -e; b="$1"; p="$2"; shift 2; mkdir -p "$b/files"; for r in "$@"; do ' \
             'mkdir -p "$b/files/$(dirname "$r")"; cp -p "$p/$r" "$b/files/$r"; done'
    t.run(Command.shell(script, backup, pkg, *[r for r, h in originals.items() if h]),
          timeout=120).check()
    t.put_stream(io.BytesIO(json.dumps(originals, indent=1).encode()), f"{backup}/manifest.json")
    state_doc = {"payload": manifest.payload, "version": manifest.version,
                 "sglang": probe["version"], "package_dir": pkg, "backup": backup,
                 "deployed_at": time.time(),
                 "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in new.items()}}
    try:
        for rel, data in new.items():
            t.put_stream(io.BytesIO(data), f"{pkg}/{rel}", mode=0o644)
        _clear_pycache(t, venv, pkg, list(new))
        t.put_stream(io.BytesIO(json.dumps(state_doc, indent=1).encode()),
                     f"{venv.rstrip('/')}/{STATE_DIR}/payload.json")
        checks = verify(t, venv, manifest, pkg, torch=found["torch"])
        failed = [c for c in checks if c.status == "failed"]
        if failed:
            raise DeployError(f"payload verify failed on {venv}: " + "; ".join(
                f"{c.name}: {c.detail}" for c in failed))
    except DeployError:
        rollback(t, venv)
        raise
    return Outcome(venv, "deployed", probe["version"], manifest.version, checks)


FULL_STACK_CHECK = "import numpy, torch; torch.Tensor; torch.zeros(1)"


def full_stack(t: ExecTransport, venv: str, torch: bool) -> str | None:
    """None when the venv can import the real stack (numpy, torch); else why not."""
    if not torch:
        return "torch is not installed in this venv"
    r = t.run(Command.of(_python(venv), "-c", FULL_STACK_CHECK), timeout=120)
    if r.ok:
        return None
    last = (r.stderr.strip().splitlines() or ["import failed"])[-1]
    return f"the full stack does not import here ({last})"


def verify(t: ExecTransport, venv: str, manifest: Manifest, pkg: str, *, torch: bool
           ) -> list[StepResult]:
    results = []
    missing = full_stack(t, venv, torch) if any(s.mode == "full" for s in manifest.verify) \
        else None
    for step in manifest.verify:
        if step.mode == "full" and missing:
            results.append(StepResult(step.name, step.mode, "skipped",
                                      f"{missing}: the normal import cannot run, so only the "
                                      "light checks (modules loaded by file) were made"))
            continue
        r = t.run(Command(argv=(_python(venv), "-", pkg), stdin=step.code.encode()), timeout=120)
        detail = (r.stdout.strip().splitlines() or [""])[-1] if r.ok else \
            (r.stderr.strip().splitlines() or ["no output"])[-1]
        results.append(StepResult(step.name, step.mode, "passed" if r.ok else "failed", detail))
    return results


def rollback(t: ExecTransport, venv: str) -> Outcome:
    found = locate(t, venv, "sglang", [])
    state = found["state"]
    if not state:
        return Outcome(venv, "nothing to roll back", found["version"])
    backup, pkg = state["backup"], state["package_dir"]
    originals: dict[str, str | None] = json.loads(_read(t, f"{backup}/manifest.json"))
    restore = [r for r, h in originals.items() if h]
    remove = [r for r, h in originals.items() if not h]
    script = 'set -e; b="$1"; p="$2"; n="$3"; shift 3; i=0; for r in "$@"; do i=$((i+1)); ' \
             'if [ "$i" -le "$n" ]; then cp -p "$b/files/$r" "$p/$r.ddtree-restore" && ' \
             'mv -f "$p/$r.ddtree-restore" "$p/$r"; else rm -f "$p/$r"; fi; done'
    t.run(Command.shell(script, backup, pkg, str(len(restore)), *restore, *remove),
          timeout=120).check()
    _clear_pycache(t, venv, pkg, list(originals))
    after = locate(t, venv, "sglang", list(originals))
    wrong = [r for r in restore if after["files"].get(r) != originals[r]]
    if wrong:
        raise RemoteCommandError(f"rollback on {venv}: {', '.join(wrong)} differ from the backup")
    t.run(Command.of("rm", "-f", f"{venv.rstrip('/')}/{STATE_DIR}/payload.json"), timeout=30
          ).check()
    return Outcome(venv, "rolled back", found["version"], state.get("version"))


def status(t: ExecTransport, venvs: list[str]) -> dict[str, dict[str, Any] | None]:
    """venv -> its payload state (None: no payload; {'error': ...}: not a venv)."""
    out: dict[str, dict[str, Any] | None] = {}
    for venv in venvs:
        try:
            out[venv] = locate(t, venv, "sglang", [])["state"]
        except DeployError as exc:
            out[venv] = {"error": str(exc)}
    return out
