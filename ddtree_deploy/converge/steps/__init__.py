"""Steps of a plan: data (printable, saved as JSON), each with why it is needed and what it
changes, or why it is already satisfied; and the registry of step kinds.

Each kind is one module of this package, named after it (`venv.create` ->
`venv_create.py`), holding its typed parameters, its `plan()` (what the facts and
hosts.yaml call for: a step, or the same step satisfied with the reason) and its
`act()` (the change, made idempotently; apply checks it by planning again on fresh
facts). The module's `STEP` is what the planner and the runner see; neither names a
kind. Modules whose names start with `_` are the code the steps carry out with.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.facts.gather import gather
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.isotime import epoch, iso_time

if TYPE_CHECKING:
    from ddtree_deploy.config.hosts import Config, Deployment, HostSpec
    from ddtree_deploy.converge.hoststate import HostState
    from ddtree_deploy.facts.model import Venv
    from ddtree_deploy.overlay.progress import ProgressSink
    from ddtree_deploy.transport.base import ExecTransport

#: every step kind, in the order the planner asks them for a deployment (the upgrade of a
#: payload before its deploy: a venv that holds another payload gets the upgrade instead)
KINDS = ("venv.create", "lane.overlay", "package.install", "payload.upgrade", "payload.deploy",
         "unit.install", "service.start", "service.probe", "unit.remove")

P = TypeVar("P", bound="Params")


@dataclass(frozen=True)
class Params:
    """A step's parameters. In JSON, a field unset (None) is left out; a field may carry
    its JSON name in its metadata ("json") where that name is a Python keyword."""

    def as_json(self) -> dict[str, Any]:
        return {f.metadata.get("json", f.name): getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def from_json(cls: type[P], data: Mapping[str, Any]) -> P:
        names = {f.metadata.get("json", f.name): f.name for f in fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"unknown parameters {', '.join(unknown)} for {cls.__name__}")
        return cls(**{names[k]: v for k, v in data.items()})


@dataclass(frozen=True)
class NoParams(Params):
    """A satisfied step's: nothing to act on."""


NO_PARAMS = NoParams()


@dataclass(frozen=True)
class UnitParams(Params):
    """A step on one systemd unit."""

    unit: str


@dataclass
class Step:
    kind: str
    host: str
    deployment: str
    title: str
    reason: str
    changes: list[str] = field(default_factory=list)
    satisfied: bool = False
    params: Params = NO_PARAMS

    @property
    def pending(self) -> bool:
        """A change to make (a check, such as the probe, is never a change)."""
        return not self.satisfied and not step_kind(self.kind).check

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "host": self.host, "deployment": self.deployment,
                "title": self.title, "reason": self.reason, "changes": list(self.changes),
                "satisfied": self.satisfied, "params": self.params.as_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Step:
        kind = step_kind(data["kind"])
        raw = data.get("params") or {}
        if not isinstance(raw, Mapping):
            raise ValueError(f"step {data['kind']}: params must be an object")
        params = kind.params.from_json(raw) if raw else NO_PARAMS
        return cls(**{**data, "params": params})


def params(step: Step, cls: type[P]) -> P:
    """The step's parameters as its kind's type (a satisfied step has none to act on)."""
    if not isinstance(step.params, cls):
        raise TypeError(f"step {step.kind}: {step.title} has no {cls.__name__} to act on")
    return step.params


@dataclass
class HostPlanning:
    """What a plan is made from: hosts.yaml, one host's facts and the tool's state there."""

    config: Config
    host: HostSpec
    facts: Facts
    state: HostState


@dataclass
class Planning(HostPlanning):
    """One deployment's planning: each kind reads what the kinds before it will produce."""

    deployment: Deployment
    venv: str  # the deployment's venv path
    basis: Venv | None = None  # the venv as the steps planned so far leave it
    changed: bool = False  # a step planned so far changes what the service runs
    installing_sglang: bool = False
    payload_planned: bool = False  # payload.upgrade took the payload's place

    def step(self, kind: str, title: str, reason: str, changes: list[str] | None = None, *,
             satisfied: bool = False, params: Params = NO_PARAMS) -> Step:
        return Step(kind, self.host.name, self.deployment.name, title, reason,
                    list(changes or []), satisfied, params)


class LiveFacts:
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


@dataclass
class Acting:
    """What a step acts with: hosts.yaml, the host, its connection, its facts."""

    config: Config
    host: HostSpec
    t: ExecTransport
    facts: LiveFacts
    probe_deadline: float = 120.0
    progress: ProgressSink | None = None  # the lane copy's bars (apply on a terminal)
    #: a step's word on where it stands (the lane copy's phase on the host), for the status
    note: Callable[[str], None] = lambda _text: None


@dataclass(frozen=True)
class StepKind:
    """One kind of step, as its module declares it (`STEP`)."""

    kind: str
    params: type[Params]
    #: the change (or, for a check, the check; it returns what it found)
    act: Callable[[Acting, Step], str | None]
    plan: Callable[[Planning], list[Step]] | None = None  # asked once per deployment
    plan_host: Callable[[HostPlanning], list[Step]] | None = None  # once per host, after
    #: it may change what the service runs: the service's restart is marked pending first
    marks_restart: bool = False
    #: what it reads on the workstation and may refuse (a secret file), checked before the
    #: runner writes anything on the host for it (the restart marker)
    precheck: Callable[[Acting, Step], None] | None = None
    #: what later steps read from the facts (the venv's python, distributions and library
    #: folders, GPUs, ports) is the same after it acted; facts are gathered again otherwise
    keeps_facts: bool = False
    check: bool = False  # run after convergence, never a change (the health probe)
    #: what apply reports before it acts (default: kind, title and changes)
    says: Callable[[Step], str] | None = None

    def announce(self, step: Step) -> str:
        if self.says is not None:
            return self.says(step)
        return f"{step.kind}: {step.title} — {'; '.join(step.changes)}"


def step_kind(kind: str) -> StepKind:
    """The registered kind `kind` (ValueError for one that is not)."""
    if kind not in KINDS:
        raise ValueError(f"unknown step kind {kind!r}")
    found = importlib.import_module(f"{__name__}.{kind.replace('.', '_')}").STEP
    assert isinstance(found, StepKind) and found.kind == kind
    return found


def registry() -> list[StepKind]:
    """Every step kind, in planning order."""
    return [step_kind(k) for k in KINDS]


@dataclass
class Plan:
    """Steps for every host that could be planned; the others' errors as data (`errors`:
    host -> {"error", "exit_code"}). A saved plan is pinned: to each host's facts
    (`fingerprints`), to the validated deployment specs it was made from (`specs`: host ->
    deployment -> digest, see spec_digests) and to the tool's version."""

    hosts: list[str]
    steps: list[Step]
    fingerprints: dict[str, str]  # host -> facts fingerprint the plan was made from
    made_at: float = 0.0
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)
    specs: dict[str, dict[str, str]] = field(default_factory=dict)
    tool_version: str = ""
    facts_at: dict[str, float] = field(default_factory=dict)  # host -> when its facts were taken
    # the errors themselves, while the plan is in memory (never saved)
    failures: dict[str, DeployError] = field(default_factory=dict, repr=False, compare=False)

    @property
    def changes(self) -> list[Step]:
        return [s for s in self.steps if s.pending]

    def exit_code(self) -> int:
        """0 nothing to change, 4 changes pending; 3 when some hosts could not be planned
        (3 wins over 4: the reachable hosts' changes are shown); every host failed: their
        shared code, else 1."""
        if self.errors:
            if len(self.errors) < len(self.hosts):
                return int(ExitCode.PARTIAL)
            codes = {int(e.get("exit_code", ExitCode.FAILED)) for e in self.errors.values()}
            return codes.pop() if len(codes) == 1 else int(ExitCode.FAILED)
        return int(ExitCode.CHANGES_PENDING) if self.changes else int(ExitCode.OK)

    def as_json(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "fingerprints": self.fingerprints,
                "made_at": iso_time(self.made_at),
                "tool_version": self.tool_version, "specs": self.specs,
                "facts_at": {h: iso_time(t) for h, t in self.facts_at.items()},
                "errors": self.errors,
                "changes": len(self.changes), "steps": [s.as_json() for s in self.steps]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        from ddtree_deploy.converge.savedplan import check_saved_plan

        check_saved_plan(data)  # ValueError naming the field: a saved plan is the user's file
        return cls(hosts=list(data["hosts"]), fingerprints=dict(data["fingerprints"]),
                   made_at=epoch(data.get("made_at", 0.0)),
                   steps=[Step.from_json(s) for s in data["steps"]],
                   errors=dict(data.get("errors") or {}), specs=dict(data.get("specs") or {}),
                   tool_version=str(data.get("tool_version") or ""),
                   facts_at={h: epoch(t) for h, t in dict(data.get("facts_at") or {}).items()})


HOST_KEY = "(host)"  # spec_digests' entry for the host's own venvs, models and GPUs


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def spec_digests(config: Config, host: HostSpec) -> dict[str, str]:
    """What a plan of `host` was made from in the hosts file, validated: each deployment on
    it (every field: port, budget, flags...) and the host's venvs, models and GPUs; a
    saved plan is refused when any of them differs."""
    out = {d.name: _digest(d.model_dump(mode="json", exclude_none=True))
           for d in config.deployments_on(host)}  # a new field left unset changes nothing
    out[HOST_KEY] = _digest(host.model_dump(mode="json", include={"venvs", "models", "gpus"},
                                            exclude_none=True))
    return out


def fingerprint(facts: Facts, venvs: list[str], units: dict[str, str | None]) -> str:
    """What a plan depends on: the deployments' venvs (distributions, torch, sglang's DDTree
    state), the installed unit texts and which GPUs are dead. Timings, PIDs and memory
    figures are left out, so a plan stays valid while nothing it relies on changes."""
    doc: dict[str, Any] = {"venvs": {}, "units": units,
                           "dead": sorted(g.index for g in facts.nvidia.gpus if g.dead)}
    for path in venvs:
        v = facts.venv(path)
        doc["venvs"][path] = None if v is None or not v.exists else {
            "dists": v.distributions,
            "torch": v.torch.model_dump() if v.torch else None,
            "ddtree": [v.sglang.knows_ddtree, v.sglang.ddtree_is_dflash] if v.sglang else None,
            "payload": v.sglang.payload.model_dump() if v.sglang and v.sglang.payload else None,
        }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
