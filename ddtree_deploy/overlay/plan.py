"""The overlay plan: what to send, keep, delete and back up, per distribution. Pure.

``plan(lane, source, target, cached)`` compares the source's lane with the target's
distributions, file by file (RECORD path and sha256):

- a lane distribution of the source is ``add``-ed when the target lacks it,
  ``same`` when the target's is identical (version, dist-info and every file), else
  ``replace``-d;
- a target distribution of the lane, or one the lane supersedes, that the source's
  lane lacks is ``remove``-d;
- ``keep``: new files already identical at the same path on the target; ``send``: every
  other new file (placed from staging by content); ``delete``: old files that no
  distribution present afterwards lists; ``backup``: every old file (the whole
  distribution, its dist-info included) of a replaced or removed distribution.

Compiled bytecode (``*.pyc``) is derived, not content: Python rewrites it whenever a
source file's mtime differs from the one it was compiled against (which a copy
changes), so it is neither compared, sent nor kept; old ``.pyc`` files are backed up
and deleted with the rest, and Python compiles the new sources on first import.
Running the plan against a target that already holds the lane gives only ``same``
and ``bytes_to_send`` 0 (also after Python rewrote its bytecode).

Paths that would leave the venv, two new distributions that disagree about one file,
a missing required distribution or differing Python versions stop the plan with a
DeployError. A path several old distributions list (``nvidia/__init__.py`` of the
cu12 wheels) is in each one's ``delete``: apply must tolerate it being gone already.
"""

from __future__ import annotations

import posixpath

from ddtree_deploy.errors import DeployError
from ddtree_deploy.overlay.lanefile import Lane
from ddtree_deploy.overlay.model import (
    Action,
    DistChange,
    DistManifest,
    Endpoint,
    FileEntry,
    OverlayPlan,
    VenvManifest,
    manifests_id,
)


class PlanError(DeployError):
    """The overlay cannot be planned safely (a bad path, a conflict, a missing distribution)."""


def _python_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check_paths(side: str, venv: VenvManifest) -> None:
    """Every RECORD path must stay inside the venv (site-packages itself when outside it)."""
    sp = posixpath.normpath(venv.site_packages)
    root = posixpath.normpath(venv.venv)
    base = posixpath.relpath(sp, root) if sp.startswith(root.rstrip("/") + "/") else "."
    for dist in venv.dists.values():
        for f in dist.files:
            where = posixpath.normpath(posixpath.join(base, f.path))
            if posixpath.isabs(f.path) or where == ".." or where.startswith("../"):
                raise PlanError(f"{side} {dist.name} {dist.version}: RECORD path {f.path!r} "
                                f"leaves the venv {venv.venv}; refusing to overlay it")


def is_derived(path: str) -> bool:
    """Bytecode Python regenerates on its own; never part of what the overlay moves."""
    return path.endswith(".pyc")


def payload(dist: DistManifest) -> list[FileEntry]:
    """The files that count: every file of RECORD but bytecode, sorted by path."""
    return sorted((f for f in dist.files if not is_derived(f.path)), key=lambda f: f.path)


def _same(a: DistManifest, b: DistManifest) -> bool:
    return (a.version, a.dist_info, payload(a)) == (b.version, b.dist_info, payload(b))


def _new_files(dists: list[DistManifest]) -> dict[str, FileEntry]:
    """path -> entry over all new distributions; two that disagree about a path stop the plan."""
    out: dict[str, FileEntry] = {}
    owner: dict[str, str] = {}
    for dist in dists:
        for f in payload(dist):
            seen = out.get(f.path)
            if seen is not None and seen.sha256 != f.sha256:
                raise PlanError(f"{owner[f.path]} and {dist.name} both install {f.path} with "
                                "different contents; the lane cannot hold both")
            out[f.path] = f
            owner.setdefault(f.path, dist.name)
    return out


def plan(
    lane: Lane,
    source: VenvManifest,
    target: VenvManifest,
    cached: set[str],
    *,
    source_host: str | None = None,
    target_host: str = "",
) -> OverlayPlan:
    """The plan that makes ``target``'s lane equal to ``source``'s.

    ``cached``: sha256s already in the workstation cache (not counted in bytes_to_send).
    ``source_host`` defaults to the lane's source host.
    """
    src_py, dst_py = _python_minor(source.python), _python_minor(target.python)
    if src_py and dst_py and src_py != dst_py:
        raise PlanError(f"the source venv runs Python {source.python} and the target "
                        f"{target.python}: compiled extensions of one do not load in the other")
    check_paths("source", source)
    check_paths("target", target)
    new = {n: d for n, d in source.dists.items() if lane.includes(n)}
    missing = [n for n in lane.required if n not in new]
    if missing:
        raise PlanError(f"the source venv {source.venv} lacks {', '.join(missing)}, which lane "
                        f"{lane.lane} requires", hint="check --from/--from-venv")
    old = {n: d for n, d in target.dists.items()
           if n in new or lane.includes(n) or lane.supersedes_name(n)}
    new_files = _new_files(list(new.values()))
    # What stays on disk afterwards: the new lane and target distributions the plan leaves alone.
    protected = set(new_files)
    for name, dist in target.dists.items():
        if name not in old:
            protected.update(f.path for f in dist.files)
    on_target: dict[str, str] = {}
    for dist in target.dists.values():
        for f in dist.files:
            on_target.setdefault(f.path, f.sha256)

    changes: list[DistChange] = []
    for name in sorted(set(new) | set(old)):
        n, o = new.get(name), old.get(name)
        if n is not None and o is not None and _same(n, o):
            changes.append(DistChange(name=name, old_version=o.version, new_version=n.version,
                                      action="same", keep=payload(n)))
            continue
        send: list[FileEntry] = []
        keep: list[FileEntry] = []
        for f in payload(n) if n else []:
            (keep if on_target.get(f.path) == f.sha256 else send).append(f)
        old_paths = sorted({f.path for f in o.files}) if o else []
        new_paths = {f.path for f in payload(n)} if n else set()
        delete = [p for p in old_paths if p not in new_paths and p not in protected]
        action: Action = "replace" if n and o else ("add" if n else "remove")
        changes.append(DistChange(
            name=name,
            old_version=o.version if o else None,
            new_version=n.version if n else None,
            action=action,
            send=send,
            keep=keep,
            delete=delete,
            backup=old_paths,
        ))
    return OverlayPlan(
        lane=lane.lane,
        source=Endpoint(host=source_host if source_host is not None else lane.source.host,
                        venv=source.venv),
        target=Endpoint(host=target_host, venv=target.venv),
        changes=changes,
        bytes_to_send=bytes_to_send(changes, cached),
        id=manifests_id([d.model_copy(update={"files": payload(d)}) for d in new.values()]),
    )


def bytes_to_send(changes: list[DistChange], cached: set[str]) -> int:
    """Sizes of the unique contents to send that the workstation cache lacks."""
    sizes: dict[str, int] = {}
    for change in changes:
        for f in change.send:
            if f.sha256 not in cached:
                sizes[f.sha256] = f.size
    return sum(sizes.values())


def unique_send(plan_: OverlayPlan) -> dict[str, int]:
    """sha256 -> size of every distinct content the plan sends (cached or not)."""
    return {f.sha256: f.size for c in plan_.changes for f in c.send}


def is_noop(plan_: OverlayPlan) -> bool:
    """True when the target already holds the lane exactly."""
    return all(c.action == "same" for c in plan_.changes)
