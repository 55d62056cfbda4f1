"""One overlay, end to end: manifests -> plan -> fetch -> push -> apply (composition only).

The parts: manifest_remote (RECORD file sets), plan (the diff), cache + transfer
(source -> workstation blob cache -> target staging), apply (the detached,
journaled swap with backups and the lane's checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddtree_deploy.config import Config
from ddtree_deploy.connect import open_transport
from ddtree_deploy.errors import UsageError
from ddtree_deploy.overlay import apply as remote_apply
from ddtree_deploy.overlay.cache import BlobCache
from ddtree_deploy.overlay.lane import Lane
from ddtree_deploy.overlay.manifest_remote import read_manifest
from ddtree_deploy.overlay.model import FileEntry, OverlayPlan
from ddtree_deploy.overlay.plan import is_noop, plan
from ddtree_deploy.overlay.progress import NullProgress, ProgressSink
from ddtree_deploy.overlay.transfer import TransferReport, fetch, push


@dataclass
class OverlayResult:
    plan: OverlayPlan
    fetched: TransferReport | None = None
    pushed: TransferReport | None = None
    outcome: remote_apply.ApplyOutcome | None = None

    @property
    def result(self) -> str:
        if self.outcome is not None:
            return self.outcome.result
        return "unchanged" if is_noop(self.plan) else "planned"


def make_plan(config: Config, lane: Lane, target_host: str, target_venv: str,
              cache: BlobCache) -> tuple[OverlayPlan, str]:
    """The plan, and the source's site-packages folder (where fetch reads)."""
    src_spec, tgt_spec = config.host(lane.source.host), config.host(target_host)
    if src_spec.name == tgt_spec.name and lane.source.venv.rstrip("/") == target_venv.rstrip("/"):
        raise UsageError("the overlay's source and target are the same venv")
    with open_transport(config, src_spec) as src:
        source = read_manifest(src, lane.source.venv, lane.source_patterns()).manifest
    with open_transport(config, tgt_spec) as tgt:
        target = read_manifest(tgt, target_venv, lane.target_patterns()).manifest
    shas = {f.sha256 for d in source.dists.values() for f in d.files}
    cached = shas - set(cache.missing(sorted(shas)))
    p = plan(lane, source, target, cached, source_host=src_spec.name, target_host=tgt_spec.name)
    return p, source.site_packages


def _sends(p: OverlayPlan) -> list[FileEntry]:
    return [f for c in p.changes for f in c.send]


def run_overlay(config: Config, lane: Lane, target_host: str, target_venv: str, *,
                cache: BlobCache, progress: ProgressSink | None = None,
                on_status: Callable[[dict[str, Any]], None] | None = None) -> OverlayResult:
    progress = progress or NullProgress()
    p, source_sp = make_plan(config, lane, target_host, target_venv, cache)
    result = OverlayResult(p)
    if is_noop(p):
        return result
    src_spec, tgt_spec = config.host(lane.source.host), config.host(target_host)
    files = _sends(p)
    with open_transport(config, src_spec) as src:
        result.fetched = fetch(src, source_sp, files, cache, progress,
                               python=f"{lane.source.venv.rstrip('/')}/bin/python",
                               sudo=src_spec.use_sudo)
    with open_transport(config, tgt_spec) as tgt:
        result.pushed = push(tgt, remote_apply.staging_dir(target_venv, p.id), files, cache,
                             progress, python=f"{target_venv.rstrip('/')}/bin/python",
                             sudo=tgt_spec.use_sudo)
        result.outcome = remote_apply.apply_plan(tgt, p, lane.checks, sudo=tgt_spec.use_sudo,
                                                 on_status=on_status)
    return result

