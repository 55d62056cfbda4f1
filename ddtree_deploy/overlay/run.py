"""One overlay, end to end, onto one target or several: manifests -> plans -> relay -> apply.

The parts: manifest (RECORD file sets), plan (the diff), relay (source ->
workstation -> every target at once, into the blob cache on the way), apply (the
detached, journaled swap with backups and the lane's checks). Targets are served
in parallel, at most `parallel` at a time; a target that fails is its own failure
(its error is kept on its result), the others go on. Every stage is timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.errors import DeployError, UsageError
from ddtree_deploy.overlay.manifest import read_manifest
from ddtree_deploy.overlay.model import FileEntry, OverlayPlan, VenvManifest
from ddtree_deploy.overlay.plan import is_noop, plan
from ddtree_deploy.overlay.progress import NullProgress, ProgressSink
from ddtree_deploy.transport.connect import open_transport
from ddtree_deploy.transport.fanout import parallel_map

if TYPE_CHECKING:  # the transfer's and the apply's modules load only when something is sent
    from ddtree_deploy.overlay.apply import ApplyOutcome
    from ddtree_deploy.overlay.blobcache import BlobCache
    from ddtree_deploy.overlay.lanefile import Lane
    from ddtree_deploy.overlay.transfer import TransferReport
    from ddtree_deploy.overlay.wire import Choice
    from ddtree_deploy.transport.base import ExecTransport

PARALLEL = 4


@dataclass
class OverlayResult:
    """One target's overlay."""

    host: str
    venv: str
    plan: OverlayPlan | None = None
    fetched: TransferReport | None = None
    pushed: TransferReport | None = None
    outcome: ApplyOutcome | None = None
    error: DeployError | None = None
    choice: Choice | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def result(self) -> str:
        if self.error is not None:
            return "failed"
        if self.outcome is not None:
            return self.outcome.result
        return "unchanged" if self.plan is not None and is_noop(self.plan) else "planned"


@dataclass
class FleetResult:
    targets: list[OverlayResult]
    fetched: TransferReport | None = None
    source_choice: Choice | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    densify_pid: int | None = None  # the detached recompression of the cache (densify.py)

    @property
    def failed(self) -> list[OverlayResult]:
        return [t for t in self.targets if t.error is not None]


def _bulk(config: Config, host: str, ears: ExecTransport | None = None) -> ExecTransport:
    """A transport for the overlay's streams: the system OpenSSH client where the host allows a
    kept master (its crypto in C: on a small workstation the CPU, not the link, is scarce).
    `ears`: apply's transport to the target, whose observers and listeners (run log, -v,
    -vv) hear these commands too (marked with the host's name when it is another host)."""
    t = open_transport(config, host, reuse=True)
    if ears is not None:
        name = config.host(host).name
        t.tell_as(ears, None if name == ears.host else name)
    return t


def _source_manifest(config: Config, lane: Lane, ears: ExecTransport | None = None
                     ) -> VenvManifest:
    with _bulk(config, lane.source.host, ears) as src:
        return read_manifest(src, lane.source.venv, lane.source_patterns()).manifest


def _check_target(config: Config, lane: Lane, host: str, venv: str) -> None:
    src = config.host(lane.source.host)
    if src.name == config.host(host).name and lane.source.venv.rstrip("/") == venv.rstrip("/"):
        raise UsageError("the overlay's source and target are the same venv")


def _target_manifest(config: Config, lane: Lane, r: OverlayResult,
                     ears: ExecTransport | None = None) -> VenvManifest:
    t0 = time.monotonic()
    with _bulk(config, r.host, ears) as tgt:
        target = read_manifest(tgt, r.venv, lane.target_patterns()).manifest
    r.seconds["target_manifest"] = round(time.monotonic() - t0, 3)
    return target


def _plan_one(config: Config, lane: Lane, source: VenvManifest, r: OverlayResult,
              cache: BlobCache, target: VenvManifest | None = None) -> None:
    if target is None:
        target = _target_manifest(config, lane, r)
    shas = {f.sha256 for d in source.dists.values() for f in d.files}
    cached = shas - set(cache.missing(sorted(shas)))
    r.plan = plan(lane, source, target, cached, source_host=config.host(lane.source.host).name,
                  target_host=config.host(r.host).name)


def make_plan(config: Config, lane: Lane, target_host: str, target_venv: str,
              cache: BlobCache) -> tuple[OverlayPlan, str]:
    """The plan, and the source's site-packages folder (where the stream reads)."""
    _check_target(config, lane, target_host, target_venv)
    source = _source_manifest(config, lane)
    r = OverlayResult(target_host, target_venv)
    _plan_one(config, lane, source, r, cache)
    assert r.plan is not None
    return r.plan, source.site_packages


def _sends(p: OverlayPlan) -> list[FileEntry]:
    return [f for c in p.changes for f in c.send]


def _guard(r: OverlayResult, fn: Callable[[], None]) -> None:
    """Run one target's step; a DeployError becomes that target's failure."""
    if r.error is not None:
        return
    try:
        fn()
    except DeployError as exc:
        r.error = exc


def run_fleet(config: Config, lane: Lane, targets: list[tuple[str, str]], *,
              cache: BlobCache, progress: ProgressSink | None = None,
              on_status: Callable[[dict[str, Any]], None] | None = None,
              parallel: int = PARALLEL, compress: str = "auto",
              densify: bool = False, ears: ExecTransport | None = None) -> FleetResult:
    """Overlay the lane onto every (host, venv); each target's failure stays its own.
    `ears`: a transport whose observers and listeners hear every command sent (see _bulk).

    densify: once done, when the source's stream stored blobs in the cache, start their
    recompression in a detached idle-priority process (densify.py; the command does not wait).
    """
    progress = progress or NullProgress()
    t0 = time.monotonic()
    for host, venv in targets:
        _check_target(config, lane, host, venv)
    results = [OverlayResult(host, venv) for host, venv in targets]
    fleet = FleetResult(results)
    workers = max(1, min(parallel, len(results)))
    manifests: dict[int, VenvManifest] = {}

    def read(r: OverlayResult) -> None:
        def go() -> None:
            manifests[id(r)] = _target_manifest(config, lane, r, ears)

        _guard(r, go)

    found: list[VenvManifest] = []  # the source's, read beside the targets'

    def read_source() -> None:
        found.append(_source_manifest(config, lane, ears))

    tasks: list[Callable[[], None]] = [read_source, *(partial(read, r) for r in results)]
    # source and targets at once, in daemon threads: Ctrl-C ends the command at once
    parallel_map(lambda task: task(), tasks, workers=workers + 1)
    (source,) = found
    fleet.seconds["manifests"] = round(time.monotonic() - t0, 3)
    t1 = time.monotonic()
    for r in results:
        if r.error is None:
            _guard(r, lambda r=r: _plan_one(config, lane, source, r, cache,  # type: ignore[misc]
                                            manifests[id(r)]))
    fleet.seconds["plans"] = round(time.monotonic() - t1, 3)
    todo = [r for r in results if r.error is None and r.plan is not None and not is_noop(r.plan)]
    if not todo:
        fleet.seconds["total"] = round(time.monotonic() - t0, 3)
        return fleet
    from ddtree_deploy.overlay import apply as remote_apply
    from ddtree_deploy.overlay.densify import spawn as spawn_densify
    from ddtree_deploy.overlay.relay import Destination, relay

    src_spec = config.host(lane.source.host)
    opened: list[ExecTransport] = []
    try:
        dests = []
        for r in todo:
            assert r.plan is not None
            spec = config.host(r.host)
            t = _bulk(config, r.host, ears)
            opened.append(t)
            dests.append(Destination(
                label=f"{r.host}:{r.venv}", transport=t,
                staging=remote_apply.staging_dir(r.venv, r.plan.id), files=_sends(r.plan),
                python=f"{r.venv.rstrip('/')}/bin/python", sudo=spec.use_sudo))
        t2 = time.monotonic()
        with _bulk(config, src_spec.name, ears) as src:
            rep = relay(src, source.site_packages, dests, cache, progress,
                        python=f"{lane.source.venv.rstrip('/')}/bin/python",
                        sudo=src_spec.use_sudo, compress=compress, parallel=parallel)
        fleet.seconds["transfer"] = round(time.monotonic() - t2, 3)
        fleet.seconds.update({f"transfer.{k}": v for k, v in rep.seconds.items()})
        fleet.fetched, fleet.source_choice = rep.fetched, rep.source_choice
        for r, d in zip(todo, dests, strict=True):
            r.fetched = rep.fetched
            r.pushed = _sum(d.forwarded, d.from_cache)
            r.choice = d.choice or rep.source_choice
            r.seconds.update({k: round(v, 3) for k, v in d.seconds.items()})
            r.error = d.error

        def apply_one(pair: tuple[OverlayResult, Destination]) -> None:
            r, d = pair
            assert r.plan is not None
            t = time.monotonic()

            def go() -> None:
                r.outcome = remote_apply.apply_plan(
                    d.transport, r.plan, lane.checks,  # type: ignore[arg-type]
                    sudo=d.sudo, on_status=on_status, poll=1.0)

            _guard(r, go)
            r.seconds["apply"] = round(time.monotonic() - t, 3)

        t3 = time.monotonic()
        parallel_map(apply_one, [(r, d) for r, d in zip(todo, dests, strict=True)
                                 if r.error is None], workers=workers)
        fleet.seconds["apply"] = round(time.monotonic() - t3, 3)
    finally:
        for t in opened:
            t.close()
    if densify and fleet.fetched is not None and fleet.fetched.files:
        fleet.densify_pid = spawn_densify(cache.root)
    fleet.seconds["total"] = round(time.monotonic() - t0, 3)
    return fleet


def _sum(a: TransferReport, b: TransferReport) -> TransferReport:
    from ddtree_deploy.overlay.transfer import TransferReport

    return TransferReport(files=a.files + b.files, payload=a.payload + b.payload,
                          wire=a.wire + b.wire, skipped=a.skipped + b.skipped,
                          compressed=a.compressed or b.compressed,
                          seconds=a.seconds + b.seconds)


def run_overlay(config: Config, lane: Lane, target_host: str, target_venv: str, *,
                cache: BlobCache, progress: ProgressSink | None = None,
                on_status: Callable[[dict[str, Any]], None] | None = None,
                ears: ExecTransport | None = None) -> OverlayResult:
    """One target; its failure raised (as before the fleet)."""
    fleet = run_fleet(config, lane, [(target_host, target_venv)], cache=cache,
                      progress=progress, on_status=on_status, ears=ears)
    (r,) = fleet.targets
    if r.error is not None:
        raise r.error
    return r
