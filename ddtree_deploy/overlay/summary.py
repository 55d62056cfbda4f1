"""What `overlay` reports: one target's summary, and the fleet's (JSON-ready dicts)."""

from __future__ import annotations

from typing import Any

from ddtree_deploy.errors import UsageError
from ddtree_deploy.overlay.run import FleetResult, OverlayResult


def parse_targets(values: list[str], venv: str | None) -> list[tuple[str, str | None]]:
    """`--to HOST:VENV` (repeatable), or one `--to HOST` with `--venv PATH`."""
    out: list[tuple[str, str | None]] = []
    for value in values:
        host, sep, path = value.partition(":")
        if not host:
            raise UsageError(f"--to {value!r}: expected HOST or HOST:VENV")
        out.append((host, path if sep else None))
    if venv is not None:
        if len(out) > 1 or any(p is not None for _, p in out):
            raise UsageError("--venv goes with one --to HOST; for several targets say "
                             "--to HOST:VENV for each")
        out = [(h, venv) for h, _ in out] or [("", venv)]
    return out


def target_summary(r: OverlayResult) -> dict[str, Any]:
    s: dict[str, Any] = {
        "result": r.result, "target": {"host": r.host, "venv": r.venv},
        "plan": r.plan.id if r.plan else None,
        "bytes_pushed": r.pushed.wire if r.pushed else 0,
        "backup": r.outcome.backup if r.outcome else None,
        "checks": r.outcome.checks if r.outcome else [],
        "seconds": r.seconds,
    }
    if r.choice is not None:
        s["compression"] = r.choice.as_dict()
    if r.error is not None:
        s["error"] = r.error.message
    return s


def fleet_summary(fleet: FleetResult, lane: str) -> dict[str, Any]:
    """One target: its summary at the top (as before the fleet); several: under `targets`."""
    fetched = fleet.fetched.wire if fleet.fetched else 0
    base: dict[str, Any] = {"lane": lane, "bytes_fetched": fetched, "seconds": fleet.seconds}
    if fleet.fetched is not None:
        base["fetch"] = {"files": fleet.fetched.files, "payload": fleet.fetched.payload,
                         "wire": fleet.fetched.wire, "compressed": fleet.fetched.compressed}
    if fleet.source_choice is not None:
        base["source_compression"] = fleet.source_choice.as_dict()
    if fleet.densify_pid is not None:
        base["recompressing_cache"] = {"pid": fleet.densify_pid}
    targets = [target_summary(r) for r in fleet.targets]
    if len(targets) == 1:
        return {**targets[0], **base}
    failed = len(fleet.failed)
    result = "failed" if failed == len(targets) else "partial" if failed else "ok"
    return {"result": result, **base, "targets": targets}
