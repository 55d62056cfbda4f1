"""Deploy, upgrade, verify, roll back and report the payload on a venv of a host.

deploy: the venv's sglang version must be one the manifest supports and every upstream file
it patches must match the manifest's sha256 (else a clear refusal naming the file). In one
round trip the host-side script (remote/payload.py) backs up the originals byte for byte
(symlinks as symlinks), writes the backup's manifest and the state, then installs each file
beside its target and renames it over; stale __pycache__ is cleared; verify runs in the venv's own
python. A failed verify rolls back (the backup folder goes with it).

A venv that already has a payload of another version or content, or whose payload files
were changed since, is upgraded in place: the recorded state and its backup are checked
(the backup's originals must be the upstream files the new payload patches), the new files
are made from those originals and installed over the old ones, what the old payload touched
and the new one does not goes back to upstream, and the backup keeps the true upstream
originals, so rollback still restores the venv as it was before any payload.

rollback restores the originals, removes the files the payload added, clears __pycache__,
checks every file, then drops the state and the backup.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_deploy.errors import ConfigError, DeployError, RefusedError, RemoteCommandError
from ddtree_deploy.payload import plugin
from ddtree_deploy.payload.lock import VenvLock
from ddtree_deploy.payload.manifest import Manifest, Support, read_file, read_text
from ddtree_deploy.payload.outcome import Outcome, StepResult
from ddtree_deploy.payload.patching import apply_patch
from ddtree_deploy.payload.state import (
    PayloadRefused,
    PayloadState,
    call,
    parse_state,
    python_of,
)
from ddtree_deploy.rules.matrix import load_matrix
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport


def _shape(found: dict[str, Any], venv: str, host: str) -> dict[str, Any]:
    ok = (isinstance(found.get("package_dir"), (str, type(None)))
          and isinstance(found.get("version"), (str, type(None)))
          and isinstance(found.get("files"), dict) and isinstance(found.get("links"), dict)
          and isinstance(found.get("state"), (str, type(None))))
    if not ok:
        raise PayloadRefused(f"{venv} on {host}: the venv's python answered a locate of the "
                             "wrong form")
    return found


def locate(t: ExecTransport, venv: str, package: str, rels: list[str],
           plugin: dict[str, Any] | None = None) -> dict[str, Any]:
    """The package folder, the installed version, each named file's sha256 (None: absent),
    torch present, the state file's text ('state'; parse it with parse_state) and, asked
    for a plugin distribution, what the venv holds of it ('plugin')."""
    return _shape(call(t, venv, "locate", package=package, rels=rels, plugin=plugin), venv,
                  t.host)


def installed(t: ExecTransport, venv: str, dist: str | None = None
              ) -> tuple[dict[str, Any], PayloadState | None]:
    found = locate(t, venv, "sglang", [], plugin={"dist": dist} if dist else None)
    return found, parse_state(found, venv, t.host)


def _supported(manifest: Manifest, version: str | None, venv: str, host: str) -> Support:
    if version is None:
        raise RefusedError(f"{venv} on {host} has no sglang installed")
    if version not in manifest.sglang:
        raise RefusedError(
            f"payload {manifest.payload} {manifest.version} does not support sglang {version} "
            f"(in {venv} on {host}); it supports: {', '.join(sorted(manifest.sglang))}"
        )
    return manifest.sglang[version]


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadRefused(f"{what} is not UTF-8 text (byte {exc.start})") from None


def _b64(doc: dict[str, Any], rel: str, what: str) -> bytes:
    value = doc.get(rel)
    if not isinstance(value, str):
        raise PayloadRefused(f"{what}: the host sent no contents for {rel}")
    return base64.b64decode(value)


@dataclass
class _Old:
    """The payload already on the venv: its state and its backup's upstream originals."""

    state: PayloadState
    backup: str
    originals: dict[str, dict[str, Any] | None]
    content: dict[str, str]


def _old_payload(t: ExecTransport, venv: str, state: PayloadState, version: str,
                 support: Support, patch_targets: list[str]) -> _Old:
    where = f"{venv} on {t.host}"
    if state.sglang != version:
        raise PayloadRefused(
            f"{where}: the payload there was made for sglang {state.sglang}, the venv now has "
            f"{version} (sglang was reinstalled under it); its backup holds another version's "
            "files", hint=f"put the venv's sglang back to {state.sglang} and run payload "
                          "rollback, or reinstall sglang and remove the venv's .ddtree-deploy")
    if state.package != support.package:
        raise PayloadRefused(f"{where}: the payload there patches package {state.package}, "
                             f"this one {support.package}; roll it back first")
    got = call(t, venv, "backup", package=support.package, backup=state.backup,
               want=patch_targets)
    originals, files = got.get("originals"), got.get("files")
    if not isinstance(originals, dict) or not isinstance(files, dict) \
            or not isinstance(got.get("content"), dict) or not isinstance(got.get("backup"), str):
        raise PayloadRefused(f"{where}: the backup answer has the wrong form")
    for rel, entry in originals.items():
        if entry is not None and files.get(rel) != entry.get("sha256"):
            raise PayloadRefused(f"{where}: the backup of {rel} in {got['backup']} is not the "
                                 "original it recorded: the upgrade cannot restore it")
    return _Old(state, got["backup"], originals, got["content"])


def _plan_files(t: ExecTransport, venv: str, manifest: Manifest, folder: Path, version: str,
                found: dict[str, Any], old: _Old | None) -> tuple[dict[str, bytes],
                                                                  dict[str, Any]]:
    """The new files (from the upstream originals) and the originals to back up now."""
    support = manifest.sglang[version]
    kept = old.originals if old else {}
    upstream: dict[str, str] = {}
    fetch = []
    for p in support.patches:
        if p.target in kept:
            entry = kept[p.target]
            have = entry.get("sha256") if entry else None
            upstream[p.target] = "backup"
        else:
            have = found["files"].get(p.target)
            fetch.append(p.target)
        if have != p.sha256:
            raise RefusedError(
                f"{venv} on {t.host}: {support.package}/{p.target} is not the sglang "
                f"{version} file the payload patches: expected sha256 {p.sha256}, found "
                f"{have or 'no such file'}" + (" (in the backup of the payload there)"
                                               if p.target in kept else ""))
    read = call(t, venv, "read", package=support.package, rels=fetch)["content"] if fetch \
        else {}
    new: dict[str, bytes] = {}
    for p in support.patches:
        src = old.content if upstream.get(p.target) == "backup" and old else read
        original = _decode(_b64(src, p.target, f"{venv} on {t.host}"),
                           f"{support.package}/{p.target} on {t.host}")
        new[p.target] = apply_patch(original, read_text(folder, p.patch),
                                    name=p.target).encode()
    for f in support.files:
        new[f.target] = read_file(folder, f.source)
    add = {rel: None if found["files"].get(rel) is None else {
        "sha256": found["files"][rel], "link": found["links"].get(rel)}
        for rel in new if rel not in kept}
    return new, add


def all_targets(manifest: Manifest) -> list[str]:
    return sorted({rel for v in manifest.sglang for rel in manifest.targets(v)})


def deploy(t: ExecTransport, venv: str, manifest: Manifest, folder: Path,
           installer: plugin.Installer = "auto", find_uv: plugin.FindUv | None = None
           ) -> Outcome:
    """The payload onto the venv in the form its sglang takes (the patch set or the plugin),
    under the venv's lock (see the module's text)."""
    matrix = load_matrix(folder, list(manifest.sglang))
    with VenvLock(t, venv, all_targets(manifest)) as lock:
        found, state = installed(t, venv)
        version = found["version"]
        form = matrix.form(version)
        if form is None:
            raise PayloadRefused(f"{venv} on {t.host}: {matrix.refusal(version)}")
        notes = _retire(t, venv, state, version, form, lock, find_uv)
        if form == "plugin":
            out = _deploy_plugin(t, venv, folder, lock, version, installer, find_uv)
        else:
            out = _deploy(t, venv, manifest, folder, lock)
    out.notes = _notes(lock) + notes + out.notes
    return out


def _retire(t: ExecTransport, venv: str, state: PayloadState | None, version: str,
            form: str, lock: VenvLock, find_uv: plugin.FindUv | None) -> list[str]:
    """A payload made for another sglang (the venv's sglang was reinstalled) or another form
    is taken off first: the plugin uninstalled, or the patch set's own leftovers removed
    (never a file the new sglang lists) with its backup of the old version's originals."""
    if state is None or (state.sglang == version and state.form == form):
        return []
    was = f"{state.form} {state.payload} {state.version} for sglang {state.sglang}"
    if state.form == "plugin":
        plugin.remove(t, venv, state.dist or state.payload, lock, find_uv=find_uv)
        return [f"the {was} was uninstalled (the venv's sglang is {version} now)"]
    if state.sglang == version:
        raise PayloadRefused(f"{venv} on {t.host}: sglang {version} holds the patch set; "
                             "roll it back first")
    got = call(t, venv, "retire", package=state.package, lock=lock.token,
               package_dir=state.package_dir, backup=state.backup, files=state.files)
    removed = got.get("removed") or []
    return [f"the {was} was retired (the venv's sglang is {version} now): "
            f"{len(removed)} of its files removed, its backup dropped"]


def _deploy_plugin(t: ExecTransport, venv: str, folder: Path, lock: VenvLock, version: str,
                   installer: plugin.Installer, find_uv: plugin.FindUv | None) -> Outcome:
    wheel = plugin.build_wheel(folder)
    found, state = installed(t, venv, dist=wheel.dist)
    have = found.get("plugin") or {}
    intact = state is not None and all(have.get("files", {}).get(rel) == h
                                       for rel, h in state.files.items())
    if plugin.same(state, wheel, version) and intact and have.get("version") == wheel.version:
        out = Outcome(venv, "unchanged", version, wheel.version, form="plugin")
        out.checks = verify(t, venv, None, found["package_dir"] or "", torch=found["torch"],
                            state=state)
        return out
    kind = plugin.install(t, venv, wheel, lock, version, installer, find_uv)
    _, now = installed(t, venv)
    checks = verify(t, venv, None, "", torch=found["torch"], state=now)
    failed = [c for c in checks if c.status == "failed"]
    if failed:
        plugin.remove(t, venv, wheel.dist, lock, installer, find_uv)
        raise DeployError(f"payload verify failed on {venv}: " + "; ".join(
            f"{c.name}: {c.detail}" for c in failed) + " (the plugin was uninstalled)")
    action = "deployed" if state is None or state.form != "plugin" else "upgraded"
    previous = None if action == "deployed" or state is None else \
        _label(state.payload, state.version, state.digest)
    return Outcome(venv, action, version, wheel.version, checks, previous=previous,
                   form="plugin", notes=[f"installed with {kind}"])


def _notes(lock: VenvLock) -> list[str]:
    notes = [lock.recovered] if lock.recovered else []
    if lock.swept:
        notes.append(f"removed {len(lock.swept)} temporary file(s) a killed run left: "
                     + ", ".join(lock.swept[:5]) + (" ..." if len(lock.swept) > 5 else ""))
    return notes


def _deploy(t: ExecTransport, venv: str, manifest: Manifest, folder: Path,
            lock: VenvLock) -> Outcome:
    probe, state = installed(t, venv)
    version = probe["version"]
    support = _supported(manifest, version, venv, t.host)
    targets = manifest.targets(version)
    digest = manifest.digest(folder, version)
    rels = list(dict.fromkeys(targets + (list(state.files) if state else [])))
    found = locate(t, venv, support.package, rels)
    pkg = found["package_dir"]
    if pkg is None:
        raise PayloadRefused(f"{venv} on {t.host} has no package folder {support.package}")
    old = None
    if state is not None:
        same = (state.payload, state.version, state.digest) == (manifest.payload,
                                                                 manifest.version, digest)
        intact = all(found["files"].get(rel) == h for rel, h in state.files.items())
        if same and intact:
            out = Outcome(venv, "unchanged", version, manifest.version)
            out.checks = verify(t, venv, manifest, pkg, torch=found["torch"], state=state)
            return out
        old = _old_payload(t, venv, state, version, support,
                           [p.target for p in support.patches])
    new, add = _plan_files(t, venv, manifest, folder, version, found, old)
    kept = old.originals if old else {}
    restore = sorted(rel for rel in kept if rel not in new)
    state_doc = {"payload": manifest.payload, "version": manifest.version, "digest": digest,
                 "sglang": version, "package": support.package, "package_dir": pkg,
                 "backup": "", "deployed_at": time.time(),
                 "files": {rel: hashlib.sha256(data).hexdigest() for rel, data in new.items()}}
    where = {"backup": old.backup} if old else {
        "new_backup": f"{manifest.payload}-{manifest.version}-{time.strftime('%Y%m%dT%H%M%S')}"
                      f"-{os.urandom(3).hex()}"}
    call(t, venv, "install", timeout=300, package=support.package, originals=add,
         restore=restore, state=state_doc, lock=lock.token,
         files={rel: base64.b64encode(data).decode() for rel, data in new.items()}, **where)
    checks = verify(t, venv, manifest, pkg, torch=found["torch"])
    failed = [c for c in checks if c.status == "failed"]
    if failed:
        _rollback(t, venv, lock)
        raise DeployError(f"payload verify failed on {venv}: " + "; ".join(
            f"{c.name}: {c.detail}" for c in failed) + " (rolled back to the upstream files)")
    if old is None:
        return Outcome(venv, "deployed", version, manifest.version, checks)
    if (old.state.payload, old.state.version, old.state.digest) == (manifest.payload,
                                                                     manifest.version, digest):
        return Outcome(venv, "repaired", version, manifest.version, checks)
    return Outcome(venv, "upgraded", version, manifest.version, checks,
                   previous=_label(old.state.payload, old.state.version, old.state.digest))


def _label(payload: str, version: str, digest: str | None) -> str:
    return f"{payload} {version}" + (f" (content {digest})" if digest else "")


FULL_STACK_CHECK = "import numpy, torch; torch.Tensor; torch.zeros(1)"


def full_stack(t: ExecTransport, venv: str, torch: bool) -> str | None:
    """None when the venv can import the real stack (numpy, torch); else why not."""
    if not torch:
        return "torch is not installed in this venv"
    r = t.run(Command.of(python_of(venv), "-B", "-c", FULL_STACK_CHECK), timeout=120)
    if r.ok:
        return None
    last = (r.stderr.strip().splitlines() or ["import failed"])[-1]
    return f"the full stack does not import here ({last})"


def files_check(t: ExecTransport, venv: str, state: PayloadState) -> StepResult:
    """The payload's files compared with the sha256 its state recorded for each."""
    found = locate(t, venv, "sglang", [], plugin={"dist": state.dist}) if state.form == "plugin" \
        else locate(t, venv, state.package, sorted(state.files))
    have = found["plugin"]["files"] if state.form == "plugin" else found["files"]
    wrong = sorted(rel for rel, digest in state.files.items() if have.get(rel) != digest)
    if wrong:
        return StepResult("files", "light", "failed",
                          f"{len(wrong)} of {len(state.files)} payload files differ from the "
                          f"sha256 recorded at deploy: {', '.join(wrong[:5])}"
                          + (" ..." if len(wrong) > 5 else ""))
    return StepResult("files", "light", "passed",
                      f"{len(state.files)} files match the sha256 recorded at deploy")


def verify(t: ExecTransport, venv: str, manifest: Manifest | None, pkg: str, *, torch: bool,
           state: PayloadState | None = None) -> list[StepResult]:
    """The recorded digests (with `state`), then the form's checks: the manifest's snippets
    for the patch set, the plugin's own check and sglang's RECORD for the plugin."""
    results = [files_check(t, venv, state)] if state is not None else []
    if state is not None and state.form == "plugin":
        missing = full_stack(t, venv, torch)
        results += [StepResult(*c) for c in plugin.plugin_checks(t, venv, full=missing is None)]
        if missing:
            results.append(StepResult("plugin_import", "full", "skipped",
                                      f"{missing}: only the plugin's light check (SGLang's "
                                      "files read, not imported) was made"))
        return results
    if manifest is None:
        return results
    missing = full_stack(t, venv, torch) if any(s.mode == "full" for s in manifest.verify) \
        else None
    for step in manifest.verify:
        if step.mode == "full" and missing:
            results.append(StepResult(step.name, step.mode, "skipped",
                                      f"{missing}: the normal import cannot run, so only the "
                                      "light checks (modules loaded by file) were made"))
            continue
        # -B: a check writes no bytecode into the venv (a stale .pyc is what deploy clears)
        r = t.run(Command(argv=(python_of(venv), "-B", "-", pkg), stdin=step.code.encode()),
                  timeout=120)
        detail = (r.stdout.strip().splitlines() or [""])[-1] if r.ok else \
            (r.stderr.strip().splitlines() or ["no output"])[-1]
        results.append(StepResult(step.name, step.mode, "passed" if r.ok else "failed", detail))
    return results


def rollback(t: ExecTransport, venv: str, manifest: Manifest | None = None,
             find_uv: plugin.FindUv | None = None) -> Outcome:
    """Every upstream file back (the plugin uninstalled), under the venv's lock."""
    with VenvLock(t, venv, all_targets(manifest) if manifest else []) as lock:
        out = _rollback(t, venv, lock, find_uv)
    out.notes = _notes(lock) + out.notes
    return out


def _rollback(t: ExecTransport, venv: str, lock: VenvLock,
              find_uv: plugin.FindUv | None = None) -> Outcome:
    found, state = installed(t, venv)
    if state is None:
        return Outcome(venv, "nothing to roll back", found["version"])
    if state.form == "plugin":
        plugin.remove(t, venv, state.dist or state.payload, lock, find_uv=find_uv)
        return Outcome(venv, "rolled back", found["version"], state.version, form="plugin")
    got = call(t, venv, "restore", timeout=300, package=state.package, lock=lock.token,
               package_dir=state.package_dir, backup=state.backup)
    if got.get("wrong"):
        raise RemoteCommandError(f"rollback on {venv}: {', '.join(map(str, got['wrong']))} "
                                 "differ from the backup (the state and backup are kept)")
    return Outcome(venv, "rolled back", found["version"], state.version)


def status(t: ExecTransport, venvs: list[str]) -> dict[str, dict[str, Any] | None]:
    """venv -> its payload state (None: no payload; {'error': ...}: not a venv, or its state
    cannot be read)."""
    out: dict[str, dict[str, Any] | None] = {}
    for venv in venvs:
        try:
            _, state = installed(t, venv)
            out[venv] = state.model_dump() if state else None
        except (DeployError, ConfigError) as exc:
            out[venv] = {"error": exc.message}
    return out
