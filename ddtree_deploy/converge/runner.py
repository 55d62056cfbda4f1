"""apply: converge one host, step by step, each checked again after it acts.

The loop: gather fresh facts, plan, take the first pending step, act, repeat, until
nothing is pending; a step that is still pending right after it acted fails the run
(with its reason as evidence). Then the probe. Everything a step does is itself
idempotent, so a killed run is resumed by running apply again. Any step that may
change what a service runs first marks the service's restart pending on the host;
the mark is cleared only once the restart is done, so a failed run's restart is
still owed by the next one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ddtree_deploy import __version__
from ddtree_deploy.config import Config, HostSpec
from ddtree_deploy.connect import open_transport
from ddtree_deploy.converge import hoststate
from ddtree_deploy.converge.planner import plan_host
from ddtree_deploy.converge.steps import Plan, Step, fingerprint
from ddtree_deploy.errors import DeployError, RefusedError
from ddtree_deploy.facts.cache import FactsCache
from ddtree_deploy.facts.gather import collect, gather
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.transport.base import ExecTransport

Report = Callable[[str], None]


@dataclass
class HostRun:
    host: str
    done: list[Step] = field(default_factory=list)
    verdict: str | None = None
    timings: list[tuple[str, float]] = field(default_factory=list)  # (step kind, seconds)
    total_s: float = 0.0


def host_facts(config: Config, host: HostSpec, *, refresh: bool) -> Facts:
    (outcome,) = collect(config, [host.name], cache=FactsCache(), refresh=refresh)
    if outcome.value is None:
        assert outcome.error is not None
        raise outcome.error
    return outcome.value


def _plan_on(config: Config, host: HostSpec, facts: Facts,
             t: ExecTransport | None = None) -> tuple[list[Step], str]:
    units = [d.unit_name for d in config.deployments_on(host)]
    if facts.tool.error is None:
        state = hoststate.from_facts(facts.tool.managed_units, facts.tool.pending_restarts, units)
    elif t is not None:  # the probe could not read the unit folder: ask the host directly
        state = hoststate.read(t, units)
    else:
        with open_transport(config, host) as own:
            state = hoststate.read(own, units)
    venvs = [str(host.venvs[d.venv].path) for d in config.deployments_on(host)]
    return plan_host(config, host, facts, state), fingerprint(facts, venvs, state.units)


def plan_for(config: Config, host: HostSpec, *, refresh: bool) -> tuple[list[Step], str]:
    return _plan_on(config, host, host_facts(config, host, refresh=refresh))


def make_plan(config: Config, hosts: list[str], *, refresh: bool) -> Plan:
    steps: list[Step] = []
    prints: dict[str, str] = {}
    for name in hosts:
        host_steps, prints[name] = plan_for(config, config.host(name), refresh=refresh)
        steps += host_steps
    return Plan(hosts, steps, prints, made_at=time.time())


class _Facts:
    """apply's view of the host: gathered over its one connection, again only when a step
    may have changed what the next step reads."""

    def __init__(self, config: Config, host: HostSpec, t: ExecTransport) -> None:
        self.config, self.host, self.t = config, host, t
        self._facts: Facts | None = None

    def fresh(self) -> Facts:
        self._facts = gather(self.config, self.host, transport=self.t)
        return self._facts

    def current(self) -> Facts:
        return self._facts if self._facts is not None else self.fresh()

    def stale(self) -> None:
        self._facts = None


def _act(config: Config, host: HostSpec, t: ExecTransport, facts: _Facts, step: Step) -> None:
    p = step.params
    if step.kind in ("venv.create", "lane.overlay", "payload.deploy", "unit.install"):
        for d in config.deployments_on(host):
            if d.name == step.deployment:
                hoststate.mark_pending(t, d.unit_name)
    if step.kind == "venv.create":
        if "clone" in p:
            from ddtree_deploy.venvclone import clone

            clone(t, p["clone"], p["venv"])
        else:
            from ddtree_deploy.transport import Command

            t.run(Command.of(f"python{p['python']}", "-m", "venv", p["venv"], sudo=True),
                  timeout=600).check()
    elif step.kind == "lane.overlay":
        from ddtree_deploy.overlay.cache import BlobCache
        from ddtree_deploy.overlay.lane import load_lane
        from ddtree_deploy.overlay.run import run_overlay

        run_overlay(config, load_lane(p["lane"]), host.name, p["venv"], cache=BlobCache())
    elif step.kind == "package.install":
        from ddtree_deploy import installer
        from ddtree_deploy.converge.deps import closure, pinned
        from ddtree_deploy.overlay.lane import load_lane

        now = facts.current()  # python, glibc; what the venv has (after venv/lane steps)
        venv = now.venv(p["venv"])
        pyver = (venv.python_version if venv else None) or "3.11"
        lane_ = load_lane(config.deployment(step.deployment).cuda_lane)
        have = venv.distributions if venv else {}
        if p["deps"]:
            wheels = closure(p["requirement"], have,
                             lambda n: lane_.includes(n) or lane_.supersedes_name(n),
                             python_version=pyver, glibc=now.host_info.glibc)
        else:
            wheels = installer.wheelhouse([installer.Requirement(p["requirement"], False)],
                                          python_version=pyver, glibc=now.host_info.glibc)
        installer.install(t, p["venv"], pinned(wheels), wheels, sudo=host.use_sudo)
        if any(w.name.lower().startswith("nvidia") for w in wheels):
            facts.stale()  # new library folders: the unit's LD_LIBRARY_PATH must see them
    elif step.kind == "payload.deploy":
        from ddtree_deploy.payload.deploy import deploy
        from ddtree_deploy.payload.manifest import load_manifest
        from ddtree_deploy.resources import data_path

        manifest, folder = load_manifest(data_path("payload"))
        deploy(t, p["venv"], manifest, folder)
    elif step.kind == "unit.install":
        from ddtree_deploy.service import install
        from ddtree_deploy.service.render import render_unit
        from ddtree_deploy.service.resolve import Overrides, build_spec

        dep = config.deployment(step.deployment)
        spec = build_spec(host, facts.current(), dep, Overrides())  # the venv's real libraries
        install.install(t, spec.unit_name, render_unit(spec, tool_version=__version__))
    elif step.kind == "service.start":
        from ddtree_deploy.service import install

        install.restart(t, p["unit"])
        hoststate.clear_pending(t, p["unit"])
    elif step.kind == "unit.remove":
        from ddtree_deploy.service import install

        install.down(t, p["unit"], remove=True)
        hoststate.clear_pending(t, p["unit"])
    # What later steps read from the facts: the venv's python and distributions (package
    # installs) and its library folders, GPUs and ports (the unit). Installing a package (the
    # lane's own distributions are never among them) or the payload changes none of those.
    if step.kind not in ("package.install", "payload.deploy"):
        facts.stale()
    FactsCache().drop(host)


def _probe(t: ExecTransport, host: HostSpec, unit: str, deadline: float,
           on_status: Callable[[str], None] | None = None) -> str:
    from ddtree_deploy.health.probe import ProbeTarget, probe_service
    from ddtree_deploy.service import install
    from ddtree_deploy.service.spec import PORT_KEY

    text = install.current_text(t, unit) or ""
    ports = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith(f"{PORT_KEY}=")]
    if not ports:
        raise DeployError(f"{host.name}: {unit} has no port in its unit")
    verdict = probe_service(t, ProbeTarget(port=int(ports[0]), unit=unit, host=host.name),
                            deadline_s=deadline, on_status=on_status)
    if verdict.status != "healthy":
        why = "; ".join(f"{m.diagnosis} (fix: {m.remedy})" for m in verdict.diagnosis)
        raise DeployError(f"{host.name}: {unit} is {verdict.status}: {verdict.reason}"
                          + (f" — {why}" if why else ""))
    return verdict.reason


class _Stopped(Exception):
    """A health probe told to stop: its verdict is no longer wanted."""


class _Probes:
    """The health probes of a round's units, one after another in one thread on the apply's
    connection (one channel besides the re-check's), started as soon as the round's steps are
    done so that the round's check (facts, plan) runs while they wait for the services.
    Read-only; stop() ends them at their next poll."""

    def __init__(self, t: ExecTransport, host: HostSpec, units: list[str],
                 deadline: float) -> None:
        self.units = units
        self.results: dict[str, tuple[str | None, BaseException | None, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._all, args=(t, host, deadline), daemon=True)
        self._thread.start()

    def _check(self, _status: str) -> None:
        if self._stop.is_set():
            raise _Stopped

    def _all(self, t: ExecTransport, host: HostSpec, deadline: float) -> None:
        for unit in self.units:
            started = time.monotonic()
            try:
                reason: str | None = _probe(t, host, unit, deadline, self._check)
                error: BaseException | None = None
            except _Stopped:
                return
            except Exception as exc:  # kept for verdict(): never lost in the thread
                reason, error = None, exc
            self.results[unit] = (reason, error, time.monotonic() - started)

    def verdict(self, unit: str) -> tuple[str, float]:
        self._thread.join()
        reason, error, seconds = self.results[unit]
        if error is not None:
            raise error
        assert reason is not None
        return reason, seconds

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


MAX_ROUNDS = 6


def apply_host(config: Config, name: str, *, expected_fingerprint: str | None = None,
               report: Report = lambda _m: None, probe_deadline: float = 120.0,
               on_plan: Callable[[list[Step]], None] | None = None) -> HostRun:
    """Under the host's lock and over one connection: rounds of plan on fresh facts, run every
    pending step in order (the planner already planned later steps on what earlier ones
    produce), until a round's plan is empty; a step still pending in the round after it ran
    fails the run. Then the verdict of each service's health probe, which starts as soon as a
    round's steps are done and runs while that round is checked. `on_plan` sees the first
    round's steps (made under the lock, so they are the ones that run)."""
    from ddtree_deploy.converge.lock import HostLock

    host = config.host(name)
    run = HostRun(name)
    t0 = time.monotonic()
    probes: _Probes | None = None
    with open_transport(config, host) as lock_t, HostLock(lock_t, host) as lock, \
            open_transport(config, host) as t:
        try:
            facts = _Facts(config, host, t)
            steps, print_ = _plan_on(config, host, facts.fresh(), t)
            if expected_fingerprint is not None and print_ != expected_fingerprint:
                raise RefusedError(f"{name}: the facts changed since the plan was made; "
                                   "make a new plan (ddtree-deploy plan)")
            if on_plan is not None:
                on_plan(steps)
            ran: set[tuple[str, str, str]] = set()
            for _ in range(MAX_ROUNDS):
                pending = [s for s in steps if s.pending]
                if not pending:
                    break
                if probes is not None:
                    probes.stop()  # a new round: their verdict would be of the old state
                    probes = None
                for step in pending:
                    key = (step.kind, step.deployment, step.title)
                    if key in ran:
                        raise DeployError(f"{name}: step '{step.kind}: {step.title}' did not "
                                          f"take effect ({step.reason})")
                    lock.check()
                    report(f"{name}: {step.kind}: {step.title} — {'; '.join(step.changes)}")
                    started = time.monotonic()
                    try:
                        _act(config, host, t, facts, step)
                    except DeployError as exc:
                        raise DeployError(f"{name}: step '{step.kind}: {step.title}' failed: "
                                          f"{exc.message}", hint=exc.hint) from exc
                    run.timings.append((step.kind, time.monotonic() - started))
                    run.done.append(step)
                    ran.add(key)
                units = [s.params["unit"] for s in steps if s.kind == "service.probe"]
                probes = _Probes(t, host, units, probe_deadline) if units else None
                now = facts.fresh()
                FactsCache().save(host, now)  # what the host is now: the next plan starts here
                steps, _ = _plan_on(config, host, now, t)
            else:
                raise DeployError(f"{name}: did not converge in {MAX_ROUNDS} rounds")
            for step in steps:
                if step.kind == "service.probe":
                    unit = step.params["unit"]
                    report(f"{name}: probing {unit}")
                    if probes is not None and unit in probes.units:
                        run.verdict, seconds = probes.verdict(unit)
                    else:
                        started = time.monotonic()
                        run.verdict = _probe(t, host, unit, probe_deadline)
                        seconds = time.monotonic() - started
                    run.timings.append(("service.probe", seconds))
        finally:
            if probes is not None:
                probes.stop()
    run.total_s = time.monotonic() - t0
    return run
