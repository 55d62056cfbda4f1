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
from typing import TYPE_CHECKING, Protocol

from ddtree_deploy.config.hosts import Config, HostSpec
from ddtree_deploy.converge import hoststate
from ddtree_deploy.converge.planner import plan_host
from ddtree_deploy.converge.steps import (
    Acting,
    LiveFacts,
    Plan,
    Step,
    fingerprint,
    spec_digests,
    step_kind,
)
from ddtree_deploy.errors import DeployError, RefusedError
from ddtree_deploy.facts.cache import FactsCache
from ddtree_deploy.facts.gather import collect
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.transport.base import ExecTransport
from ddtree_deploy.transport.connect import open_transport

if TYPE_CHECKING:
    from ddtree_deploy.converge.lock import HostLock
    from ddtree_deploy.converge.runlog import RunLog
    from ddtree_deploy.overlay.progress import ProgressSink
    from ddtree_deploy.transport.base import Observer
    from ddtree_deploy.transport.live import Listener


class Watch(Protocol):
    """What apply tells the one who watches it: each step as it begins (with what it does)
    and as it ends (its seconds, whether it went well)."""

    def began(self, host: str, step: Step, text: str) -> None: ...

    def ended(self, host: str, step: Step, seconds: float, ok: bool) -> None: ...

    def note(self, host: str, text: str) -> None:
        """A step's word on where it stands (the lane copy's phase on the host)."""


class Unwatched:
    def began(self, host: str, step: Step, text: str) -> None:
        return None

    def note(self, host: str, text: str) -> None:
        return None

    def ended(self, host: str, step: Step, seconds: float, ok: bool) -> None:
        return None


@dataclass
class HostRun:
    host: str
    done: list[Step] = field(default_factory=list)
    verdict: str | None = None
    timings: list[tuple[str, str, float]] = field(default_factory=list)  # (kind, title, s)
    total_s: float = 0.0
    log: RunLog | None = field(default=None, repr=False)

    def record(self, step: Step, seconds: float, ok: bool) -> None:
        if ok:
            self.timings.append((step.kind, step.title, seconds))
        if self.log is not None:
            self.log.step(step.kind, step.title, step.deployment, seconds, ok)


def host_facts(config: Config, host: HostSpec, *, refresh: bool) -> Facts:
    (outcome,) = collect(config, [host.name], cache=FactsCache(), refresh=refresh)
    if outcome.value is None:
        assert outcome.error is not None
        raise outcome.error
    return outcome.value


def _plan_on(config: Config, host: HostSpec, facts: Facts,
             t: ExecTransport | None = None) -> tuple[list[Step], str]:
    units = [d.unit_name for d in config.deployments_on(host)]
    if facts.tool.error is None and not facts.tool.secrets_unread:
        state = hoststate.from_facts(facts.tool.managed_units, facts.tool.pending_restarts, units,
                                     facts.tool.secrets_digests)
    elif t is not None:  # the probe could not read the unit folder or a secrets digest
        # (root-only): ask the host directly, with sudo
        state = hoststate.read(t, units)
    else:
        with open_transport(config, host) as own:
            state = hoststate.read(own, units)
    venvs = [str(host.venvs[d.venv].path) for d in config.deployments_on(host)]
    return plan_host(config, host, facts, state), fingerprint(facts, venvs, state.units)


def plan_for(config: Config, host: HostSpec, *, refresh: bool
             ) -> tuple[list[Step], str, float]:
    """The host's steps, its facts' fingerprint and when those facts were taken."""
    facts = host_facts(config, host, refresh=refresh)
    steps, print_ = _plan_on(config, host, facts)
    return steps, print_, facts.taken_at


def make_plan(config: Config, hosts: list[str], *, refresh: bool, concurrency: int = 8) -> Plan:
    """Every host planned in parallel; a host that cannot be planned (unreachable, refused)
    is an error of the plan, never a reason to hide the others'."""
    from ddtree_deploy import __version__
    from ddtree_deploy.transport.fanout import fan_out

    outcomes = fan_out(hosts, lambda name: plan_for(config, config.host(name), refresh=refresh),
                       concurrency=concurrency)
    steps: list[Step] = []
    prints: dict[str, str] = {}
    taken: dict[str, float] = {}
    errors: dict[str, dict[str, object]] = {}
    failures: dict[str, DeployError] = {}
    for o in outcomes:
        if o.value is None:
            assert o.error is not None
            errors[o.host] = {"error": str(o.error), "exit_code": int(o.error.exit_code)}
            failures[o.host] = o.error
            continue
        host_steps, prints[o.host], taken[o.host] = o.value
        steps += host_steps
    return Plan(hosts, steps, prints, made_at=time.time(), errors=errors,
                specs={h: spec_digests(config, config.host(h)) for h in hosts},
                tool_version=__version__, facts_at=taken, failures=failures)


def _act(ctx: Acting, step: Step) -> None:
    """One pending step, through its kind: what it reads on the workstation checked first
    (nothing written on the host when that fails), then its service's restart marked
    pending when it may change what the service runs; the facts dropped after it when it
    may change what the next step reads."""
    kind = step_kind(step.kind)
    if kind.precheck is not None:
        kind.precheck(ctx, step)
    if kind.marks_restart:
        for d in ctx.config.deployments_on(ctx.host):
            if d.name == step.deployment:
                hoststate.mark_pending(ctx.t, d.unit_name)
    kind.act(ctx, step)
    if not kind.keeps_facts:
        ctx.facts.stale()
    FactsCache().drop(ctx.host)


MAX_ROUNDS = 6


def secret_values(config: Config, host: HostSpec) -> frozenset[str]:
    """The deployments' API keys and HF tokens on `host`, as the workstation holds them:
    masked in everything apply shows and logs. A file that cannot be read is the step's
    to report (unit.install), not a reason to stop here."""
    from ddtree_deploy.errors import ConfigError
    from ddtree_deploy.service.endpoint import read_secrets

    out: set[str] = set()
    for d in config.deployments_on(host):
        try:
            s = read_secrets(d.api_key_file, d.hf_token_file, d.name)
        except ConfigError:
            continue
        out.update(v for v in (s.api_key, s.hf_token) if v)
    return frozenset(out)


def apply_host(config: Config, name: str, *, expected_fingerprint: str | None = None,
               watch: Watch | None = None, probe_deadline: float = 120.0,
               on_plan: Callable[[list[Step]], None] | None = None,
               log: RunLog | None = None, observers: tuple[Observer, ...] = (),
               listeners: tuple[Listener, ...] = (),
               progress: ProgressSink | None = None) -> HostRun:
    """Under the host's lock (held on a connection of its own), over one more connection:
    rounds of plan on fresh facts, run every pending step in order (the planner already
    planned later steps on what earlier ones produce), until a round's plan is empty; a step
    still pending in the round after it ran fails the run. Then each service's health probe.
    `on_plan` sees the first round's steps (made under the lock, so they are the ones that
    run); `watch` each step begin and end. `log` records every command sent on the work
    connection (and on those the lane copy and pip on the workstation open for it, marked)
    and every step; `observers` are also told of each command (-v), `listeners` of each line
    of its output as it comes; the deployments' secrets are masked in all."""
    from ddtree_deploy.converge.lock import HostLock  # apply only: plan stays light

    host = config.host(name)
    run = HostRun(name, log=log)
    secrets = secret_values(config, host)
    if log is not None:
        log.redact = secrets
    t0 = time.monotonic()
    try:
        with open_transport(config, host) as lock_t, HostLock(lock_t, host) as lock, \
                open_transport(config, host) as t:
            t.observers = (*observers, *((log.command,) if log is not None else ()))
            t.listeners = listeners
            t.redact = secrets
            _converge(config, host, t, lock, run, expected_fingerprint, watch or Unwatched(),
                      probe_deadline, on_plan, progress)
    except BaseException as exc:
        if log is not None:
            log.end(str(exc) or type(exc).__name__)
        raise
    if log is not None:
        log.end(None)
    run.total_s = time.monotonic() - t0
    return run


def _converge(config: Config, host: HostSpec, t: ExecTransport, lock: HostLock, run: HostRun,
              expected_fingerprint: str | None, watch: Watch, probe_deadline: float,
              on_plan: Callable[[list[Step]], None] | None,
              progress: ProgressSink | None = None) -> HostRun:
    name = host.name
    facts = LiveFacts(config, host, t)
    ctx = Acting(config, host, t, facts, probe_deadline, progress,
                 note=lambda text: watch.note(name, text))
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
            watch.began(name, step, step_kind(step.kind).announce(step))
            started = time.monotonic()
            try:
                _act(ctx, step)
            except BaseException as exc:
                seconds = time.monotonic() - started
                run.record(step, seconds, ok=False)
                watch.ended(name, step, seconds, ok=False)
                if not isinstance(exc, DeployError):
                    raise
                raise DeployError(f"{name}: step '{step.kind}: {step.title}' failed: "
                                  f"{exc.message}", hint=exc.hint, output=exc.output) from exc
            seconds = time.monotonic() - started
            run.record(step, seconds, ok=True)
            watch.ended(name, step, seconds, ok=True)
            run.done.append(step)
            ran.add(key)
        now = facts.fresh()
        FactsCache().save(host, now)  # what the host is now: the next plan starts here
        steps, _ = _plan_on(config, host, now, t)
    else:
        raise DeployError(f"{name}: did not converge in {MAX_ROUNDS} rounds")
    for step in steps:
        kind = step_kind(step.kind)
        if kind.check:
            watch.began(name, step, kind.announce(step))
            started = time.monotonic()
            try:
                run.verdict = kind.act(ctx, step)
            except BaseException:
                run.record(step, time.monotonic() - started, ok=False)
                watch.ended(name, step, time.monotonic() - started, ok=False)
                raise
            run.record(step, time.monotonic() - started, ok=True)
            watch.ended(name, step, time.monotonic() - started, ok=True)
    return run
