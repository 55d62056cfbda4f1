"""`overlay --to HOST:VENV` (repeatable) and the fleet's summary and exit codes."""

from __future__ import annotations

import pytest

from ddtree_deploy.errors import DeployError, UsageError
from ddtree_deploy.overlay.run import FleetResult, OverlayResult
from ddtree_deploy.overlay.summary import fleet_summary, parse_targets


def test_targets_are_host_venv_pairs_or_one_host_with_venv() -> None:
    assert parse_targets(["ct200:/root/a", "ct201:/root/b"], None) == [
        ("ct200", "/root/a"), ("ct201", "/root/b")]
    assert parse_targets(["ct200"], "/root/v") == [("ct200", "/root/v")]
    assert parse_targets(["ct200"], None) == [("ct200", None)]
    assert parse_targets([], "/root/v") == [("", "/root/v")]
    assert parse_targets([], None) == []


@pytest.mark.parametrize("to,venv", [(["ct200:/a", "ct201:/b"], "/c"), (["ct200:/a"], "/c"),
                                     ([":/a"], None)])
def test_ambiguous_targets_are_refused(to: list[str], venv: str | None) -> None:
    with pytest.raises(UsageError):
        parse_targets(to, venv)


def test_fleet_summary_keeps_each_failure_its_own() -> None:
    ok, bad = OverlayResult("ct200", "/a"), OverlayResult("ct201", "/b")
    bad.error = DeployError("ct201: no space")
    fleet = FleetResult([ok, bad], seconds={"total": 1.0})
    s = fleet_summary(fleet, "cu130")
    assert s["result"] == "partial" and [t["result"] for t in s["targets"]] == ["planned",
                                                                                 "failed"]
    assert s["targets"][1]["error"] == "ct201: no space" and "error" not in s["targets"][0]
    ok.error = DeployError("x")
    assert fleet_summary(fleet, "cu130")["result"] == "failed"
    one = fleet_summary(FleetResult([OverlayResult("ct200", "/a")]), "cu130")
    assert one["target"] == {"host": "ct200", "venv": "/a"} and "targets" not in one


def test_the_cache_recompression_is_named_only_when_started() -> None:
    started = FleetResult([OverlayResult("ct200", "/a")], densify_pid=4321)
    assert fleet_summary(started, "cu130")["recompressing_cache"] == {"pid": 4321}
    assert "recompressing_cache" not in fleet_summary(
        FleetResult([OverlayResult("ct200", "/a")]), "cu130")
