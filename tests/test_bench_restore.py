"""bench with systemd: the unit installed before the sweep is put back byte for byte (also after
Ctrl-C), a sweep that found none removes its own, a unit the tool did not create is refused.

The unit folder and systemctl are an in-memory host here (the install module's functions
replaced); the lab's systemd runs the same install code in tests/test_lab_service.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.bench import grid as gridmod
from ddtree_deploy.bench import sweep as sweepmod
from ddtree_deploy.bench import workloads
from ddtree_deploy.bench.results import Results
from ddtree_deploy.bench.server import SystemdControl
from ddtree_deploy.errors import RefusedError
from ddtree_deploy.health.probe import Verdict
from ddtree_deploy.service.spec import MANAGED_KEY, ServiceSpec
from ddtree_deploy.transport.base import Result

UNIT = "sglang-ddtree.service"
ORIGINAL = (f"# hand-tuned once  \n[Unit]\n{MANAGED_KEY}=yes\nDescription=before  \n\n"
            "[Service]\nExecStart=/opt/v/bin/python -m sglang.launch_server --port 30001\n"
            "Environment=\"X=a  b\"\n")


@dataclass
class FakeHost:
    units: dict[str, str] = field(default_factory=dict)
    active: bool = False
    log: list[str] = field(default_factory=list)

    def current_text(self, t: Any, unit: str) -> str | None:
        return self.units.get(unit)

    def install(self, t: Any, unit: str, text: str) -> bool:
        changed = self.units.get(unit) != text
        self.units[unit] = text
        self.log.append(f"install {'changed' if changed else 'same'}")
        return changed

    def restart(self, t: Any, unit: str) -> None:
        self.active = True
        self.log.append("restart")

    def down(self, t: Any, unit: str, *, remove: bool = False) -> bool:
        self.active = False
        if remove:
            self.units.pop(unit, None)
        self.log.append(f"down remove={remove}")
        return True

    def systemctl(self, t: Any, *args: str, check: bool = True) -> Result:
        if args[0] == "stop":
            self.active = False
        self.log.append(" ".join(args))
        return Result("systemctl", 0, "", "", 0.0)


class FakeTransport:
    host = "ct200"

    def __init__(self, fake: FakeHost) -> None:
        self.fake = fake

    def run(self, cmd: Any, *, timeout: float | None = None) -> Result:
        if cmd.argv[:2] == ("systemctl", "is-active"):
            return Result("systemctl is-active", 0 if self.fake.active else 3,
                          "active\n" if self.fake.active else "inactive\n", "", 0.0)
        raise AssertionError(f"unexpected command {cmd.argv}")


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    from ddtree_deploy.service import install

    host = FakeHost()
    for name in ("current_text", "install", "restart", "down"):
        monkeypatch.setattr(install, name, getattr(host, name))
    monkeypatch.setattr(install, "_systemctl", host.systemctl)
    monkeypatch.setattr("ddtree_deploy.bench.server._probe",
                        lambda *a, **k: Verdict("healthy", "ok"))
    return host


def _plan(tmp_path: Path) -> tuple[sweepmod.Plan, Results]:
    grid = gridmod.from_flags("dflash,ddtree:15/8", "1", "greedy", "code", workloads.names(),
                              requests=1, warmup_requests=0)
    base = ServiceSpec(name="sglang-ddtree", host="ct200", venv="/opt/v", gpus=(1,), port=30001,
                       model_path="/m/t", deployment="sglang-ddtree")
    specs = {c.key: sweepmod.spec_for(base, c, "/m/d", 16) for c in grid.configs}
    results = Results.open(tmp_path / "r.json", host="ct200", service="sglang-ddtree")
    return sweepmod.make_plan(grid, specs, results, ids=False, vocab=1000), results


def _load(seen: list[str]) -> Any:
    def run_load(t: Any, spec: ServiceSpec, sessions: Any, **kw: Any) -> dict[str, Any]:
        seen.append(spec.algorithm)
        return {"wall_s": 1.0, "requests": [{"ok": True, "tokens": 8, "ttft": 0.1, "e2e": 0.5,
                                             "arrivals": [[0.1, 4], [0.5, 8]], "meta": {}}]}
    return run_load


def test_the_unit_installed_before_is_put_back_byte_for_byte(
        fake: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.units[UNIT], fake.active = ORIGINAL, True
    seen: list[str] = []
    monkeypatch.setattr(sweepmod, "run_load", _load(seen))
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    summary = sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                                 deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert seen == ["dflash", "ddtree"] and summary["measured"] == 2
    assert fake.units[UNIT] == ORIGINAL and fake.active
    assert summary["restored"] == f"{UNIT} put back byte for byte and restarted"
    assert fake.log[-2:] == ["install changed", "restart"]
    assert results.configs["ddtree-15-8"]["mode"] == "systemd"


def test_ctrl_c_puts_back_the_stopped_unit_and_leaves_it_stopped(
        fake: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.units[UNIT], fake.active = ORIGINAL, False

    def interrupted(*a: Any, **k: Any) -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweepmod, "run_load", interrupted)
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                           deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert fake.units[UNIT] == ORIGINAL and not fake.active
    assert fake.log[-1] == "stop " + UNIT


def test_without_a_unit_before_the_bench_s_own_is_removed(
        fake: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweepmod, "run_load", _load([]))
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    summary = sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                                 deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert UNIT not in fake.units and summary["restored"].endswith("(there was none before)")


def test_a_unit_the_tool_did_not_create_is_left_alone(fake: FakeHost, tmp_path: Path) -> None:
    fake.units[UNIT] = "[Service]\nExecStart=/usr/bin/true\n"
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    with pytest.raises(RefusedError, match="was not created by ddtree-deploy"):
        sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                           deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert fake.units[UNIT] == "[Service]\nExecStart=/usr/bin/true\n" and fake.log == []
