"""Venv roles are enforced (issue 30, item 4): nothing writes into a source or training venv.

plan refuses a deployment whose steps would write into such a venv (packages, lane, payload,
a clone into it) unless the venv says `allow_writes: true`; the story's clone FROM the
training venv stays allowed, as does serving from a source venv that needs no change. The
commands that write into a venv directly refuse a protected one before connecting; doctor
flags a deployment served from one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_converge_plan import CU130, facts, installed_unit, pending
from typer.testing import CliRunner

from ddtree_deploy.cli.app import build_app
from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.converge.hoststate import HostState
from ddtree_deploy.converge.planner import plan_host
from ddtree_deploy.errors import RefusedError
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.rules import diagnose

SERVING = "role: serving             # where the DDTree build goes"


def hosts_with(tmp_path: Path, role: str, allow: bool = False) -> Path:
    text = embedded_hosts_file().read_text()
    assert SERVING in text
    line = f"role: {role}" + ("\n        allow_writes: true" if allow else "")
    path = tmp_path / "hosts.yaml"
    path.write_text(text.replace(SERVING, line))
    return path


@pytest.mark.parametrize("role", ["training", "source"])
def test_plan_refuses_writes_into_a_protected_venv(tmp_path: Path, role: str) -> None:
    config = load_config(hosts_with(tmp_path, role))
    f = facts(True, {k: v for k, v in CU130.items() if k != "soundfile"})
    state = HostState(units={"sglang-ddtree.service": installed_unit(f)})
    with pytest.raises(RefusedError) as refused:
        plan_host(config, config.host("ct200"), f, state)
    text = str(refused.value)
    assert f"role is {role}" in text and "package.install (soundfile==0.13.1)" in text
    assert "allow_writes: true" in text


def test_plan_refuses_a_clone_into_a_protected_venv(tmp_path: Path) -> None:
    config = load_config(hosts_with(tmp_path, "training"))
    with pytest.raises(RefusedError, match="venv.create"):
        plan_host(config, config.host("ct200"), facts(False), HostState())


def test_allow_writes_lets_the_plan_through(tmp_path: Path) -> None:
    config = load_config(hosts_with(tmp_path, "training", allow=True))
    f = facts(True, {k: v for k, v in CU130.items() if k != "soundfile"})
    state = HostState(units={"sglang-ddtree.service": installed_unit(f)})
    steps = plan_host(config, config.host("ct200"), f, state)
    assert pending(steps) == [("package.install", "soundfile==0.13.1")]


def test_serving_from_a_source_venv_that_needs_nothing_is_allowed(tmp_path: Path) -> None:
    config = load_config(hosts_with(tmp_path, "source"))
    f = facts(True)
    state = HostState(units={"sglang-ddtree.service": installed_unit(f)})
    assert pending(plan_host(config, config.host("ct200"), f, state)) == []


def test_cloning_from_the_training_venv_stays_allowed() -> None:
    config = load_config(embedded_hosts_file())  # venv_sglang211: create: {clone: venv}
    steps = plan_host(config, config.host("ct200"), facts(False), HostState())
    assert pending(steps)[0] == ("venv.create", "venv /root/venv_sglang211")


@pytest.mark.parametrize("args", [
    ["venv", "clone", "ct200", "/root/venv_sglang", "/root/venv"],
    ["payload", "deploy", "ct200", "--venv", "/root/venv"],
    ["payload", "rollback", "ct200", "--venv", "/root/venv/"],
    ["overlay", "--abi", "cu130", "--to", "ct200:/root/venv"],
    ["overlay", "rollback", "ct200", "--venv", "/root/venv"],
])
def test_direct_writes_into_a_protected_venv_are_refused(args: list[str]) -> None:
    full = ["--hosts", str(embedded_hosts_file()), *args]
    result = CliRunner().invoke(build_app(full), full)
    assert result.exit_code != 0
    assert isinstance(result.exception, RefusedError), result.output
    assert "whose role is training" in str(result.exception)


def test_doctor_flags_a_deployment_served_from_a_training_venv(tmp_path: Path) -> None:
    config = load_config(hosts_with(tmp_path, "training"))
    dep = config.deployment("sglang-ddtree")
    spec = config.host("ct200").venvs[dep.venv]
    found = diagnose(facts(True), venv=str(spec.path), deployment=dep, venv_spec=spec)
    (role,) = [f for f in found if f.id == "deploy.venv-role"]
    assert role.severity == "warning" and role.evidence["role"] == "training"
    served = load_config(embedded_hosts_file())
    spec = served.host("ct200").venvs["venv_sglang211"]
    assert not [f for f in diagnose(facts(True), venv=str(spec.path),
                                    deployment=served.deployment("sglang-ddtree"),
                                    venv_spec=spec) if f.id == "deploy.venv-role"]
