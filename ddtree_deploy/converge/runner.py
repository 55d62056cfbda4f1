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
from ddtree_deploy.facts.gather import collect
from ddtree_deploy.facts.model import Facts

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


def plan_for(config: Config, host: HostSpec, *, refresh: bool) -> tuple[list[Step], str]:
    facts = host_facts(config, host, refresh=refresh)
    units = [d.unit_name for d in config.deployments_on(host)]
    if facts.tool.error is None:
        state = hoststate.from_facts(facts.tool.managed_units, facts.tool.pending_restarts, units)
    else:  # the probe could not read the unit folder: ask the host directly
        with open_transport(config, host) as t:
            state = hoststate.read(t, units)
    venvs = [str(host.venvs[d.venv].path) for d in config.deployments_on(host)]
    return plan_host(config, host, facts, state), fingerprint(facts, venvs, state.units)


def make_plan(config: Config, hosts: list[str], *, refresh: bool) -> Plan:
    steps: list[Step] = []
    prints: dict[str, str] = {}
    for name in hosts:
        host_steps, prints[name] = plan_for(config, config.host(name), refresh=refresh)
        steps += host_steps
    return Plan(hosts, steps, prints, made_at=time.time())


def _act(config: Config, host: HostSpec, step: Step, report: Report) -> None:
    p = step.params
    with open_transport(config, host) as t:
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

            facts = host_facts(config, host, refresh=False)  # python, glibc: unchanged
            venv = facts.venv(p["venv"])
            pyver = (venv.python_version if venv else None) or "3.11"
            lane_ = load_lane(config.deployment(step.deployment).cuda_lane)
            have = venv.distributions if venv else {}
            if p["deps"]:
                wheels = closure(p["requirement"], have,
                                 lambda n: lane_.includes(n) or lane_.supersedes_name(n),
                                 python_version=pyver, glibc=facts.host_info.glibc)
            else:
                wheels = installer.wheelhouse([installer.Requirement(p["requirement"], False)],
                                              python_version=pyver, glibc=facts.host_info.glibc)
            installer.install(t, p["venv"], pinned(wheels), wheels, sudo=host.use_sudo)
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
            facts = host_facts(config, host, refresh=True)
            spec = build_spec(host, facts, dep, Overrides())
            install.install(t, spec.unit_name, render_unit(spec, tool_version=__version__))
        elif step.kind == "service.start":
            from ddtree_deploy.service import install

            install.restart(t, p["unit"])
            hoststate.clear_pending(t, p["unit"])
        elif step.kind == "unit.remove":
            from ddtree_deploy.service import install

            install.down(t, p["unit"], remove=True)
            hoststate.clear_pending(t, p["unit"])
    if step.kind != "package.install":  # the next round re-gathers anyway
        FactsCache().drop(host)


def _probe(config: Config, host: HostSpec, unit: str, deadline: float) -> str:
    from ddtree_deploy.health.probe import ProbeTarget, probe_service
    from ddtree_deploy.service import install
    from ddtree_deploy.service.spec import PORT_KEY

    with open_transport(config, host) as t:
        text = install.current_text(t, unit) or ""
        ports = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith(f"{PORT_KEY}=")]
        if not ports:
            raise DeployError(f"{host.name}: {unit} has no port in its unit")
        verdict = probe_service(t, ProbeTarget(port=int(ports[0]), unit=unit, host=host.name),
                                deadline_s=deadline)
    if verdict.status != "healthy":
        why = "; ".join(f"{m.diagnosis} (fix: {m.remedy})" for m in verdict.diagnosis)
        raise DeployError(f"{host.name}: {unit} is {verdict.status}: {verdict.reason}"
                          + (f" — {why}" if why else ""))
    return verdict.reason


MAX_ROUNDS = 6


def apply_host(config: Config, name: str, *, expected_fingerprint: str | None = None,
               report: Report = lambda _m: None, probe_deadline: float = 120.0) -> HostRun:
    """Rounds of: plan on fresh facts, run every pending step in order (the planner already
    planned later steps on what earlier ones produce), until a round's plan is empty; a
    step still pending in the round after it ran fails the run. Then the probe."""
    host = config.host(name)
    run = HostRun(name)
    from ddtree_deploy.converge.lock import HostLock

    t0 = time.monotonic()
    with HostLock(config, host):
        steps, print_ = plan_for(config, host, refresh=True)
        if expected_fingerprint is not None and print_ != expected_fingerprint:
            raise RefusedError(f"{name}: the facts changed since the plan was made; "
                               "make a new plan (ddtree-deploy plan)")
        ran: set[tuple[str, str, str]] = set()
        for _ in range(MAX_ROUNDS):
            pending = [s for s in steps if s.pending]
            if not pending:
                break
            for step in pending:
                key = (step.kind, step.deployment, step.title)
                if key in ran:
                    raise DeployError(f"{name}: step '{step.kind}: {step.title}' did not take "
                                      f"effect ({step.reason})")
                report(f"{name}: {step.kind}: {step.title} — {'; '.join(step.changes)}")
                started = time.monotonic()
                try:
                    _act(config, host, step, report)
                except DeployError as exc:
                    raise DeployError(f"{name}: step '{step.kind}: {step.title}' failed: "
                                      f"{exc.message}", hint=exc.hint) from exc
                run.timings.append((step.kind, time.monotonic() - started))
                run.done.append(step)
                ran.add(key)
            steps, _ = plan_for(config, host, refresh=True)
        else:
            raise DeployError(f"{name}: did not converge in {MAX_ROUNDS} rounds")
        for step in steps:
            if step.kind == "service.probe":
                report(f"{name}: probing {step.params['unit']}")
                started = time.monotonic()
                run.verdict = _probe(config, host, step.params["unit"], probe_deadline)
                run.timings.append(("service.probe", time.monotonic() - started))
    run.total_s = time.monotonic() - t0
    return run
