"""The planner and the host state parser (pure): steps, reasons, satisfied steps, removal."""

from __future__ import annotations

from pathlib import Path

from story_facts import CU130, V, story_facts

from ddtree_deploy import __version__
from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.converge.hoststate import HostState, parse
from ddtree_deploy.converge.planner import plan_host
from ddtree_deploy.converge.steps import Plan, fingerprint
from ddtree_deploy.converge.steps.venv_create import VenvCreate
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.service.render import render_unit
from ddtree_deploy.service.resolve import build_spec


def facts(venv_exists: bool, dists: dict[str, str] | None = None, ddtree: bool = True,
          active: bool = True) -> Facts:
    return Facts.model_validate(story_facts(venv_exists, dists, ddtree, active))


def installed_unit(f: Facts) -> str:
    config = load_config(embedded_hosts_file())
    spec = build_spec(config, config.host("ct200"), f, config.deployment("sglang-ddtree"))
    return render_unit(spec, tool_version=__version__)


def pending(steps: list) -> list[tuple[str, str]]:
    return [(s.kind, s.title) for s in steps if s.pending]


def test_from_nothing_every_step_of_the_story() -> None:
    config = load_config(embedded_hosts_file())
    steps = plan_host(config, config.host("ct200"), facts(False), HostState())
    kinds = [k for k, _ in pending(steps)]
    assert kinds[:2] == ["venv.create", "lane.overlay"]
    assert ("package.install", "sglang==0.5.11") in pending(steps)
    assert ("package.install", "soundfile==0.13.1") in pending(steps)
    assert kinds[-3:] == ["payload.deploy", "unit.install", "service.start"]
    create = steps[0]
    assert create.params == VenvCreate(V, clone="/root/venv") and "does not exist" in create.reason
    assert create.as_json()["params"] == {"venv": V, "clone": "/root/venv"}


def test_converged_host_has_no_changes_and_says_why() -> None:
    config = load_config(embedded_hosts_file())
    f = facts(True)
    state = HostState(units={"sglang-ddtree.service": installed_unit(f)})
    steps = plan_host(config, config.host("ct200"), f, state)
    assert pending(steps) == []
    assert all(s.reason for s in steps)


def test_a_removed_package_is_exactly_one_step() -> None:
    config = load_config(embedded_hosts_file())
    f = facts(True, {k: v for k, v in CU130.items() if k != "soundfile"})
    state = HostState(units={"sglang-ddtree.service": installed_unit(f)})
    steps = plan_host(config, config.host("ct200"), f, state)
    assert pending(steps) == [("package.install", "soundfile==0.13.1")]


def test_pending_restart_and_stopped_service() -> None:
    config = load_config(embedded_hosts_file())
    f = facts(True)
    state = HostState(units={"sglang-ddtree.service": installed_unit(f)},
                      pending={"sglang-ddtree.service"})
    steps = plan_host(config, config.host("ct200"), f, state)
    assert pending(steps) == [("service.start", "sglang-ddtree.service")]
    assert "pending from an earlier run" in steps[-2].reason
    stopped = facts(True, active=False)
    steps = plan_host(config, config.host("ct200"), stopped,
                      HostState(units={"sglang-ddtree.service": installed_unit(stopped)}))
    assert pending(steps) == [("service.start", "sglang-ddtree.service")]


def test_payload_missing_and_removed_deployment() -> None:
    config = load_config(embedded_hosts_file())
    f = facts(True, ddtree=False)
    state = HostState(units={"sglang-ddtree.service": installed_unit(f)},
                      managed={"old.service": "gone-deployment",
                               "sglang-ddtree.service": "sglang-ddtree"})
    steps = plan_host(config, config.host("ct200"), f, state)
    assert pending(steps) == [("payload.deploy", "DDTree payload"),
                              ("unit.install", "sglang-ddtree.service"),
                              ("service.start", "sglang-ddtree.service"),
                              ("unit.remove", "old.service")]


def test_fingerprint_follows_what_the_plan_depends_on() -> None:
    a = fingerprint(facts(True), [V], {"u": "x"})
    assert a == fingerprint(facts(True), [V], {"u": "x"})
    assert a != fingerprint(facts(True, {"torch": "2.11.0"}), [V], {"u": "x"})
    assert a != fingerprint(facts(True), [V], {"u": "y"})
    plan = Plan(["ct200"], [], {"ct200": a})
    assert Plan.from_json(plan.as_json()).fingerprints == {"ct200": a}


def test_host_state_parse_gives_exact_unit_text() -> None:
    text = "[Unit]\nDescription=x\n"
    out = f"@unit a.service\n{text}\n@end\n@unit b.service\n@absent\n@managed\n" \
          "a.service dep-a\n@pending\nb.service\n@done\n"
    state = parse(out)
    assert state.units == {"a.service": text, "b.service": None}
    assert state.managed == {"a.service": "dep-a"} and state.pending == {"b.service"}


def test_only_wheels_with_nvidia_library_folders_make_the_unit_gather_again(
    tmp_path: Path,
) -> None:
    import zipfile

    from ddtree_deploy.converge.steps.package_install import adds_library_folders

    def wheel(name: str, members: list[str]) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as zf:
            for member in members:
                zf.writestr(member, b"")
        return path

    ml_py = wheel("nvidia_ml_py-13.580.82-py3-none-any.whl",
                  ["pynvml.py", "nvidia_ml_py-13.580.82.dist-info/RECORD"])
    soundfile = wheel("soundfile-0.13.1-py2.py3-none-any.whl", ["soundfile.py"])
    cudnn = wheel("nvidia_cudnn_cu13-9.13.0.50-py3-none-manylinux_2_27_x86_64.whl",
                  ["nvidia/cudnn/lib/libcudnn.so.9", "nvidia/cudnn/include/cudnn.h"])
    assert not adds_library_folders([ml_py, soundfile])
    assert adds_library_folders([soundfile, cudnn])


def test_a_changed_unit_is_planned_with_its_diff() -> None:
    config = load_config(embedded_hosts_file())
    f = facts(True)
    current = installed_unit(f)
    old = current.replace("--port 30001", "--port 30002")
    assert old != current
    steps = plan_host(config, config.host("ct200"), f,
                      HostState(units={"sglang-ddtree.service": old}))
    (unit,) = [s for s in steps if s.kind == "unit.install"]
    assert unit.reason == "the unit differs"
    minus = [c for c in unit.changes if c.startswith("unit -")]
    plus = [c for c in unit.changes if c.startswith("unit +")]
    assert len(minus) == len(plus) == 1
    assert "--port 30002" in minus[0] and "--port 30001" in plus[0]


def test_a_package_step_says_old_and_new() -> None:
    config = load_config(embedded_hosts_file())
    f = facts(True, {**CU130, "soundfile": "0.12.1"})
    state = HostState(units={"sglang-ddtree.service": installed_unit(f)})
    steps = plan_host(config, config.host("ct200"), f, state)
    (step,) = [s for s in steps if s.pending]
    assert "soundfile: 0.12.1 -> ==0.13.1" in step.changes


def test_plan_json_times_are_iso_8601_and_old_epochs_still_read() -> None:
    import datetime

    plan = Plan(["ct200"], [], {"ct200": "f"}, made_at=1764774245.5,
                facts_at={"ct200": 1764774200.0})
    doc = plan.as_json()
    assert doc["made_at"] == "2025-12-03T15:04:05.500+00:00"
    assert datetime.datetime.fromisoformat(doc["facts_at"]["ct200"]).timestamp() == 1764774200.0
    assert Plan.from_json(doc).made_at == 1764774245.5
    older = {**doc, "made_at": 1764774245.5, "facts_at": {"ct200": 1764774200.0}}
    assert Plan.from_json(older).facts_at == {"ct200": 1764774200.0}
