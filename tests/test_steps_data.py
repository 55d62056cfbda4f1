"""The plan step kinds, driven from data: tests/data/steps/<kind>/*.json (facts and hosts.yaml
in, that kind's steps or no-op reasons out; the format is in tests/data/steps/README.md).
Also: the registry knows exactly the kinds that have a module and cases."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddtree_deploy.config.hosts import Config, load_config
from ddtree_deploy.converge.hoststate import HostState
from ddtree_deploy.converge.planner import plan_host
from ddtree_deploy.converge.steps import KINDS, NO_PARAMS, Plan, Step, registry, step_kind
from ddtree_deploy.converge.steps.unit_install import unit_text
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.payload.manifest import shipped_identity
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.service.resolve import build_spec

DATA = Path(__file__).parent / "data" / "steps"
STEPS_PACKAGE = Path(__file__).parent.parent / "ddtree_deploy" / "converge" / "steps"
CASES = sorted(DATA.glob("*/*.json"))


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _tokens(text: str, hosts_file: Path) -> str:
    shipped = shipped_identity("0.5.11")
    assert shipped is not None
    _, version, digest = shipped
    plugin = shipped_identity("0.5.17")  # the plugin wheel built from payload/plugin/
    assert plugin is not None
    return (text.replace("{shipped_version}", version).replace("{shipped_digest}", digest or "")
            .replace("{plugin_version}", plugin[1]).replace("{plugin_digest}", plugin[2] or "")
            .replace("{hosts_file}", str(hosts_file)))


def _config(case: dict[str, Any], tmp_path: Path) -> Config:
    hosts = yaml.safe_load(embedded_hosts_file().read_text())
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(_merge(copy.deepcopy(hosts), case.get("hosts_yaml") or {}),
                                   sort_keys=False))
    return load_config(path)


def _state(case: dict[str, Any], config: Config, host: str, facts: Facts) -> HostState:
    raw = case.get("state", {})
    units: dict[str, str | None] = {}
    for unit, text in raw.get("units", {}).items():
        if text == "@rendered":
            dep = next(d for d in config.deployments_on(config.host(host)) if d.unit_name == unit)
            text = unit_text(build_spec(config, config.host(host), facts, dep))
        units[unit] = text
    return HostState(units=units, managed=dict(raw.get("managed", {})),
                     pending=set(raw.get("pending", [])))


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_step_case(path: Path, tmp_path: Path) -> None:
    kind = path.parent.name
    assert kind in KINDS, f"{path}: no step kind {kind!r}"
    case = json.loads(_tokens(path.read_text(), tmp_path / "hosts.yaml"))
    assert case.get("about"), f"{path}: say what the case shows ('about')"
    config = _config(case, tmp_path)
    host = case["host"]
    facts = Facts.model_validate(case["facts"])
    state = _state(case, config, host, facts)
    if "error" in case:
        with pytest.raises(ConfigError) as refused:
            plan_host(config, config.host(host), facts, state)
        assert refused.value.message == case["error"]
        return
    steps = plan_host(config, config.host(host), facts, state)
    got = [{k: v for k, v in s.as_json().items() if k not in ("kind", "host")}
           for s in steps if s.kind == kind]
    assert got == case["steps"]
    assert [f"{s.kind}: {s.title}" for s in steps if s.pending] == case["pending"]
    for s in steps:  # what a saved plan carries reads back as the same typed step
        assert Step.from_json(s.as_json()) == s
    saved = json.loads(json.dumps(Plan([host], steps, {host: "f"}, made_at=1.0,
                                       specs={host: {"d": "x"}}, tool_version="v").as_json()))
    assert Plan.from_json(saved).steps == steps  # the saved plan's checked shape takes them


def test_every_kind_has_a_module_and_cases_and_nothing_else_is_one() -> None:
    modules = {p.stem for p in STEPS_PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    assert modules == {k.replace(".", "_") for k in KINDS}
    assert {p.name for p in DATA.iterdir() if p.is_dir()} == set(KINDS)
    assert [k.kind for k in registry()] == list(KINDS)
    for kind in registry():
        assert (kind.plan is None) != (kind.plan_host is None), kind.kind


def test_only_checks_are_never_pending() -> None:
    checks = [k.kind for k in registry() if k.check]
    assert checks == ["service.probe"]
    probe = Step("service.probe", "h", "d", "t", "r")
    start = Step("service.start", "h", "d", "t", "r")
    assert not probe.pending and start.pending
    assert not Step("service.start", "h", "d", "t", "r", satisfied=True).pending


def test_a_saved_plan_with_an_unknown_kind_or_parameter_is_refused() -> None:
    step = {"kind": "venv.create", "host": "h", "deployment": "d", "title": "t",
            "reason": "r", "changes": [], "satisfied": False,
            "params": {"venv": "/v", "clone": "/s"}}
    plan = {"hosts": ["h"], "fingerprints": {"h": "x"}, "steps": [step]}
    assert Plan.from_json(plan).steps[0].params == step_kind("venv.create").params.from_json(
        {"venv": "/v", "clone": "/s"})
    with pytest.raises(ValueError, match="unknown step kind 'venv.destroy'"):
        Plan.from_json({**plan, "steps": [{**step, "kind": "venv.destroy"}]})
    with pytest.raises(ValueError, match="unknown parameters shell"):
        Plan.from_json({**plan, "steps": [{**step, "params": {"venv": "/v", "shell": "rm"}}]})
    assert Plan.from_json({**plan, "steps": [{**step, "params": {}}]}).steps[0].params \
        is NO_PARAMS
