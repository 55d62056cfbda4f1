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

import re
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from ddtree_deploy.converge.lock import HostLock

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


def _adds_library_folders(wheels: list[Path]) -> bool:
    """Whether a wheel puts files in nvidia/<component>/lib, the folders a unit's
    LD_LIBRARY_PATH is made of (read from the wheels' zip directories)."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if any(_NVIDIA_LIB.match(n) for n in zf.namelist()):
                return True
    return False


_NVIDIA_LIB = re.compile(r"nvidia/[^/]+/lib/")


def _act(config: Config, host: HostSpec, t: ExecTransport, facts: _Facts, step: Step) -> None:
    p = step.params
    if step.kind in ("venv.create", "lane.overlay", "payload.deploy", "payload.upgrade",
                     "unit.install"):
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
        if _adds_library_folders(wheels):
            facts.stale()  # new nvidia/*/lib folders: the unit's LD_LIBRARY_PATH must see them
    elif step.kind in ("payload.deploy", "payload.upgrade"):  # deploy upgrades in place
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
    # installs) and its library folders, GPUs and ports (the unit). The payload changes none
    # of those; a package install only the library folders, handled above.
    if step.kind not in ("package.install", "payload.deploy", "payload.upgrade"):
        facts.stale()
    FactsCache().drop(host)


def _probe(t: ExecTransport, host: HostSpec, unit: str, deadline: float) -> str:
    from ddtree_deploy.health.probe import ProbeTarget, probe_service
    from ddtree_deploy.service import install
    from ddtree_deploy.service.spec import PORT_KEY

    text = install.current_text(t, unit) or ""
    ports = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith(f"{PORT_KEY}=")]
    if not ports:
        raise DeployError(f"{host.name}: {unit} has no port in its unit")
    ids = True if "--skip-tokenizer-init" in text else None  # the server takes input_ids
    verdict = probe_service(t, ProbeTarget(port=int(ports[0]), unit=unit, host=host.name,
                                           input_ids=ids), deadline_s=deadline)
    if verdict.status != "healthy":
        why = "; ".join(f"{m.diagnosis} (fix: {m.remedy})" for m in verdict.diagnosis)
        raise DeployError(f"{host.name}: {unit} is {verdict.status}: {verdict.reason}"
                          + (f" — {why}" if why else ""))
    return verdict.reason


MAX_ROUNDS = 6


def apply_host(config: Config, name: str, *, expected_fingerprint: str | None = None,
               report: Report = lambda _m: None, probe_deadline: float = 120.0,
               on_plan: Callable[[list[Step]], None] | None = None) -> HostRun:
    """Under the host's lock (held on a connection of its own), over one more connection:
    rounds of plan on fresh facts, run every pending step in order (the planner already
    planned later steps on what earlier ones produce), until a round's plan is empty; a step
    still pending in the round after it ran fails the run. Then each service's health probe.
    `on_plan` sees the first round's steps (made under the lock, so they are the ones that
    run)."""
    from ddtree_deploy.converge.lock import HostLock

    host = config.host(name)
    run = HostRun(name)
    t0 = time.monotonic()
    with open_transport(config, host) as lock_t, HostLock(lock_t, host) as lock, \
            open_transport(config, host) as t:
        _converge(config, host, t, lock, run, expected_fingerprint, report, probe_deadline,
                  on_plan)
    run.total_s = time.monotonic() - t0
    return run


def _converge(config: Config, host: HostSpec, t: ExecTransport, lock: HostLock, run: HostRun,
              expected_fingerprint: str | None, report: Report, probe_deadline: float,
              on_plan: Callable[[list[Step]], None] | None) -> HostRun:
    name = host.name
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
        now = facts.fresh()
        FactsCache().save(host, now)  # what the host is now: the next plan starts here
        steps, _ = _plan_on(config, host, now, t)
    else:
        raise DeployError(f"{name}: did not converge in {MAX_ROUNDS} rounds")
    for step in steps:
        if step.kind == "service.probe":
            report(f"{name}: probing {step.params['unit']}")
            started = time.monotonic()
            run.verdict = _probe(t, host, step.params["unit"], probe_deadline)
            run.timings.append(("service.probe", time.monotonic() - started))
    return run
