"""bench with systemd: the unit installed before the sweep is put back byte for byte (also after
Ctrl-C; bytes that are not UTF-8 too), running or stopped and enabled or disabled as it was, a
sweep that found none removes its own, a unit the tool did not create is refused.

The unit folder and systemctl are an in-memory host here (the install module's functions
replaced); tests/test_lab_bench.py runs the same sweep against the lab's systemd over SSH."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from bench_specs import base_spec, specs_for

from ddtree_deploy.bench import grid as gridmod
from ddtree_deploy.bench import sweep as sweepmod
from ddtree_deploy.bench import workloads
from ddtree_deploy.bench.results import Results
from ddtree_deploy.bench.server import SystemdControl
from ddtree_deploy.errors import RefusedError
from ddtree_deploy.health.check import Verdict
from ddtree_deploy.service.spec import MANAGED_KEY, UNIT_DIR, ServiceSpec
from ddtree_deploy.transport.base import Result

UNIT = "sglang-ddtree.service"
ORIGINAL = (f"# hand-tuned once  \n[Unit]\n{MANAGED_KEY}=yes\nDescription=before  \n\n"
            "[Service]\nExecStart=/opt/v/bin/python -m sglang.launch_server --port 30001\n"
            "Environment=\"X=a  b\"\n").encode()


@dataclass
class FakeHost:
    """The unit folder (bytes) and systemd's state of each unit."""

    units: dict[str, bytes] = field(default_factory=dict)
    active: bool = False
    enabled: bool = False
    log: list[str] = field(default_factory=list)

    def current_text(self, t: Any, unit: str) -> str | None:
        data = self.units.get(unit)
        return None if data is None else data.decode("utf-8", errors="replace")  # as transports

    def install(self, t: Any, unit: str, text: str) -> bool:
        changed = self.units.get(unit) != text.encode()
        self.units[unit] = text.encode()
        self.log.append(f"install {'changed' if changed else 'same'}")
        return changed

    def restart(self, t: Any, unit: str) -> None:
        self.active = self.enabled = True  # install.restart enables, then restarts
        self.log.append("restart")

    def down(self, t: Any, unit: str, *, remove: bool = False) -> bool:
        self.active = self.enabled = False
        if remove:
            self.units.pop(unit, None)
        self.log.append(f"down remove={remove}")
        return True

    def systemctl(self, t: Any, *args: str, check: bool = True) -> Result:
        if args[0] == "stop":
            self.active = False
        elif args[0] == "disable":
            self.enabled = False
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
        if cmd.argv[:2] == ("systemctl", "is-enabled"):
            return Result("systemctl is-enabled", 0 if self.fake.enabled else 1,
                          "enabled\n" if self.fake.enabled else "disabled\n", "", 0.0)
        raise AssertionError(f"unexpected command {cmd.argv}")

    def run_stream_out(self, cmd: Any, dst: Any, *, timeout: float | None = None) -> Result:
        unit = cmd.argv[-1].rsplit("/", 1)[-1]  # the unit file SystemdControl reads
        assert cmd.argv[-1] == f"{UNIT_DIR}/{unit}", cmd.argv
        if unit not in self.fake.units:
            return Result("cat", 3, "", "", 0.0)
        dst.write(self.fake.units[unit])
        return Result("cat", 0, "", "", 0.0)

    def put_stream(self, src: Any, remote_path: str, *, mode: int | None = None,
                   sudo: bool = False) -> int:
        data = src.read()
        self.fake.units[remote_path.rsplit("/", 1)[-1]] = data
        self.fake.log.append("put back")
        return len(data)


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
    base = base_spec(name="sglang-ddtree", host="ct200", venv="/opt/v", gpus=(1,), port=30001,
                     model_path="/m/t", deployment="sglang-ddtree")
    specs = specs_for(base, grid, "/m/d")
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
    fake.units[UNIT], fake.active, fake.enabled = ORIGINAL, True, True
    seen: list[str] = []
    monkeypatch.setattr(sweepmod, "run_load", _load(seen))
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    summary = sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                                 deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert seen == ["dflash", "ddtree"] and summary["measured"] == 2
    assert fake.units[UNIT] == ORIGINAL and fake.active
    assert summary["restored"] == f"{UNIT} put back byte for byte and restarted"
    assert fake.log[-3:] == ["put back", "daemon-reload", "restart"] and fake.enabled
    assert results.configs["ddtree-15-8"]["mode"] == "systemd"


def test_ctrl_c_puts_back_the_stopped_unit_and_leaves_it_stopped(
        fake: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.units[UNIT], fake.active, fake.enabled = ORIGINAL, False, True

    def interrupted(*a: Any, **k: Any) -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweepmod, "run_load", interrupted)
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    with pytest.raises(sweepmod.SweepInterrupted) as stopped:  # a KeyboardInterrupt
        sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                           deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert fake.units[UNIT] == ORIGINAL and not fake.active and fake.enabled
    assert fake.log[-1] == "stop " + UNIT
    # the CLI prints this summary (--json) before it exits 130
    said = stopped.value.summary
    assert said["interrupted"] is True and said["measured"] == 0
    assert said["restored"] == f"{UNIT} put back byte for byte (stopped, as it was)"


def test_a_disabled_unit_is_left_stopped_and_disabled(
        fake: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`service down` leaves a unit stopped and disabled; each restart of the sweep enables it
    (install.restart), so the sweep's end must disable it again, or it starts at the next boot."""
    fake.units[UNIT], fake.active, fake.enabled = ORIGINAL, False, False
    monkeypatch.setattr(sweepmod, "run_load", _load([]))
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    summary = sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                                 deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert summary["measured"] == 2 and "restart" in fake.log
    assert fake.units[UNIT] == ORIGINAL and not fake.active and not fake.enabled
    assert summary["restored"] == (f"{UNIT} put back byte for byte (stopped, as it was), "
                                   "disabled as it was")


def test_bytes_that_are_not_utf8_are_put_back_as_they_were(
        fake: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit's text is read through a lossy decode (U+FFFD for a byte that is not UTF-8);
    the bytes put back, and the comparison after, must not go through it."""
    original = ORIGINAL + b"# r\xe9vision 2 (Latin-1)\r\n"
    fake.units[UNIT], fake.active, fake.enabled = original, True, True
    monkeypatch.setattr(sweepmod, "run_load", _load([]))
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                       deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert fake.units[UNIT] == original


def test_without_a_unit_before_the_bench_s_own_is_removed(
        fake: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweepmod, "run_load", _load([]))
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    summary = sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                                 deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert UNIT not in fake.units and summary["restored"].endswith("(there was none before)")


def test_a_unit_the_tool_did_not_create_is_left_alone(fake: FakeHost, tmp_path: Path) -> None:
    fake.units[UNIT] = b"[Service]\nExecStart=/usr/bin/true\n"
    plan, results = _plan(tmp_path)
    control = SystemdControl(FakeTransport(fake), UNIT)  # type: ignore[arg-type]
    with pytest.raises(RefusedError, match="was not created by ddtree-deploy"):
        sweepmod.run_sweep(FakeTransport(fake), control, plan, results,  # type: ignore[arg-type]
                           deadline_s=10, warmup_s=10, hooks=sweepmod.Hooks())
    assert fake.units[UNIT] == b"[Service]\nExecStart=/usr/bin/true\n" and fake.log == []
