"""The plugin form on a venv whose sglang is 0.5.17+: the `ddtree-sglang-plugin` wheel, built
on the workstation from payload/plugin/ (its build.py: stdlib only, the same bytes every run),
installed into the venv with uv (the host's own, else the pinned one pushed: `_install_uv`) or,
where uv cannot be pushed, the venv's own pip (`--no-index --no-deps`). SGLang loads it itself
through its `sglang.srt.plugins` entry point: nothing is written into the sglang package.

The state (`.ddtree-deploy/payload.json`, form "plugin") is written by the host after the
installer finished and the distribution's files match its RECORD; verify compares them with the
sha256 recorded then, runs the plugin's own check (`python -I -m ddtree_sglang.check`, `--full`
where torch imports) and checks that every file of sglang's RECORD still has its hash. rollback
uninstalls the distribution and drops the state.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ddtree_deploy import xdg
from ddtree_deploy.errors import ConfigError, DeployError, RemoteCommandError
from ddtree_deploy.payload.lock import VenvLock
from ddtree_deploy.payload.state import PayloadState, call, python_of
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport
from ddtree_deploy.transport.command import mask_secrets

GROUP = "sglang.srt.plugins"
Installer = Literal["auto", "uv", "pip"]
# Finds or pushes uv on the host and returns its path (converge's _install_uv.ensure_uv, passed
# in by the CLI and the plan step); it raises DeployError where uv cannot be pushed.
FindUv = Callable[[ExecTransport], str]


@dataclass(frozen=True)
class Wheel:
    path: Path
    dist: str  # the distribution's name (METADATA)
    version: str
    sha256: str
    entry_points: tuple[str, ...]  # "name = value" lines of GROUP
    members: tuple[str, ...] = ()  # its files, as paths inside site-packages

    @property
    def identity(self) -> tuple[str, str, str]:
        """(payload, version, digest) as a state records them."""
        return self.dist, self.version, self.sha256[:16]


def _read_wheel(path: Path) -> Wheel:
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
            meta = zf.read(f"{info}/METADATA").decode("utf-8", "replace")
            eps = zf.read(f"{info}/entry_points.txt").decode("utf-8", "replace") \
                if f"{info}/entry_points.txt" in names else ""
    except (OSError, zipfile.BadZipFile, StopIteration, KeyError) as exc:
        raise ConfigError(f"{path}: not a plugin wheel ({exc})") from None
    fields = dict(line.split(":", 1) for line in meta.splitlines()[:20] if ":" in line)
    section, points = None, []
    for line in eps.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
        elif section == GROUP and "=" in line:
            points.append(line)
    if not points:
        raise ConfigError(f"{path}: the wheel has no {GROUP} entry point")
    return Wheel(path, fields.get("Name", "").strip(), fields.get("Version", "").strip(),
                 hashlib.sha256(path.read_bytes()).hexdigest(), tuple(points),
                 tuple(n for n in names if not n.endswith("/")))


def build_wheel(folder: Path, out: Path | None = None) -> Wheel:
    """The plugin wheel of a payload folder, built by its own build.py (into the tool's cache
    by default)."""
    script = folder / "plugin" / "build.py"
    if not script.is_file():
        raise ConfigError(f"{folder} holds no plugin (no plugin/build.py): the plugin form "
                          "cannot be deployed from it")
    spec = importlib.util.spec_from_file_location("ddtree_plugin_build", script)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{script}: cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        path = module.build_wheel(out or xdg.cache_dir() / "plugin-wheel")
    except Exception as exc:  # the build script's own errors, as a clear message
        raise ConfigError(f"{script}: the plugin wheel did not build: {exc}") from None
    return _read_wheel(Path(path))


def _installer(t: ExecTransport, venv: str, want: Installer, find_uv: FindUv | None
               ) -> tuple[str, list[str]]:
    """('uv' | 'pip', the argv before `install`/`uninstall` and its arguments)."""
    py = python_of(venv)
    why = "" if find_uv is not None else "no uv finder given"
    if want in ("auto", "uv") and find_uv is not None:
        try:
            return "uv", [find_uv(t), "pip"]
        except DeployError as exc:
            if want == "uv":
                raise
            why = exc.message
    elif want == "uv":
        raise DeployError(f"{venv} on {t.host}: --installer uv, but {why}")
    r = t.run(Command.of(py, "-m", "pip", "--version"), timeout=120)
    if not r.ok:
        raise DeployError(f"{venv} on {t.host}: no installer for the plugin: uv cannot be "
                          f"pushed ({why or 'not tried'}) and the venv has no pip",
                          hint="install uv on the host, or pip in the venv")
    return "pip", [py, "-m", "pip"]


def _run(t: ExecTransport, argv: list[str], what: str) -> None:
    r = t.run(Command.of(*argv), timeout=600)
    if not r.ok:
        tail = "; ".join(mask_secrets(r.stderr or r.stdout, r.secrets).strip()
                         .splitlines()[-4:])[-600:]
        raise RemoteCommandError(f"{t.host}: {what} failed (exit {r.exit_code}): {tail}",
                                 output=r.error_output())  # whole: apply -vv, --debug


def install(t: ExecTransport, venv: str, wheel: Wheel, lock: VenvLock, sglang: str,
            installer: Installer = "auto", find_uv: FindUv | None = None) -> str:
    """The wheel into the venv, then the state recorded by the host. Returns the installer.
    The host notes first what the install may add (plugin_stage); an install that fails is
    undone from that note (plugin_undo), one cut short by a kill by the next lock's holder."""
    staged = call(t, venv, "plugin_stage", package="sglang", lock=lock.token,
                  name=wheel.path.name, adds=list(wheel.members))["path"]
    try:
        with wheel.path.open("rb") as src:
            t.put_stream(src, staged, mode=0o644)
        kind, argv = _installer(t, venv, installer, find_uv)
        if kind == "uv":
            _run(t, [*argv, "install", "--python", python_of(venv), "--no-deps", "--no-index",
                     "--no-cache", "--reinstall", staged], "uv pip install of the plugin")
        else:
            _run(t, [*argv, "install", "--no-index", "--no-deps", "--force-reinstall",
                     "--no-cache-dir", "--disable-pip-version-check", staged],
                 "pip install of the plugin")
    except DeployError:
        _undo(t, venv, lock)
        raise
    finally:
        t.run(Command.of("rm", "-f", "--", staged), timeout=60)
    dist, version, digest = wheel.identity
    state = {"payload": dist, "version": version, "digest": digest, "sglang": sglang,
             "form": "plugin", "dist": dist, "package": "sglang", "deployed_at": time.time(),
             "installer": kind, "wheel_sha256": wheel.sha256}
    call(t, venv, "plugin_record", package="sglang", lock=lock.token, state=state, dist=dist,
         dist_version=version)
    return kind


def _undo(t: ExecTransport, venv: str, lock: VenvLock) -> None:
    """What a failed install added taken off again; where that fails too, its note stays and
    the next holder of the venv's lock undoes it (the error of the install is the one said)."""
    with contextlib.suppress(DeployError):
        call(t, venv, "plugin_undo", package="sglang", lock=lock.token)


def remove(t: ExecTransport, venv: str, dist: str, lock: VenvLock,
           installer: Installer = "auto", find_uv: FindUv | None = None) -> None:
    """Uninstall the distribution (if there) and drop the state."""
    found = call(t, venv, "locate", package="sglang", rels=[], plugin={"dist": dist})
    if (found.get("plugin") or {}).get("version") is not None:
        kind, argv = _installer(t, venv, installer, find_uv)
        _run(t, [*argv, "uninstall", "--python", python_of(venv), dist] if kind == "uv" else
             [*argv, "uninstall", "-y", "--disable-pip-version-check", dist],
             f"{kind} uninstall of the plugin")
    call(t, venv, "plugin_forget", package="sglang", lock=lock.token, dist=dist)


def plugin_checks(t: ExecTransport, venv: str, *, full: bool) -> list[tuple[str, str, str, str]]:
    """(name, mode, status, detail) of the plugin's own check and sglang's RECORD."""
    out = []
    modes: list[tuple[str, str, list[str]]] = [("plugin", "light", [])]
    if full:
        modes.append(("plugin_import", "full", ["--full"]))
    for name, mode, extra in modes:
        r = t.run(Command.of(python_of(venv), "-I", "-B", "-m", "ddtree_sglang.check", *extra),
                  timeout=300)
        last = (r.stdout.strip().splitlines() or [""])[-1]
        detail = last or "; ".join(r.stderr.strip().splitlines()[-2:]) or f"exit {r.exit_code}"
        ok = r.ok
        try:
            doc: Any = json.loads(last)
            ok = ok and isinstance(doc, dict) and doc.get("supported") is True \
                and doc.get("entry_point") is True
        except ValueError:
            ok = False
        out.append((name, mode, "passed" if ok else "failed", detail[:500]))
    got = call(t, venv, "sglang_intact", package="sglang", dist="sglang")
    changed = int(got.get("changed_count", 0))
    out.append(("sglang_untouched", "light", "failed" if changed else "passed",
                f"{changed} of sglang's files differ from its RECORD: "
                + ", ".join(map(str, got.get("changed", [])[:5])) if changed else
                f"all {got.get('checked')} files of sglang's RECORD have their recorded hash"))
    return out


def same(state: PayloadState | None, wheel: Wheel, sglang: str) -> bool:
    return state is not None and state.form == "plugin" and state.sglang == sglang and (
        state.payload, state.version, state.digest) == wheel.identity
