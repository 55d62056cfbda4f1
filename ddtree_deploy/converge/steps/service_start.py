"""`service.start`: (re)start the deployment's unit when the steps before it changed what it
runs, when an earlier run left its restart pending, or when it is not active. The
pending mark is cleared once the restart is done."""

from __future__ import annotations

from ddtree_deploy.converge import hoststate
from ddtree_deploy.converge.steps import Acting, Planning, Step, StepKind, UnitParams, params
from ddtree_deploy.service import install

KIND = "service.start"


def plan(ctx: Planning) -> list[Step]:
    unit = ctx.deployment.unit_name
    active = any(u.name == unit and u.active == "active" for u in ctx.facts.services.units)
    pending = unit in ctx.state.pending
    ok = active and not ctx.changed and not pending
    reason = ("active and up to date" if ok else
              "a restart is pending from an earlier run" if pending else
              "the steps above change what it runs" if ctx.changed else f"{unit} is not active")
    return [ctx.step(KIND, unit, reason, [] if ok else [f"restart {unit}"], satisfied=ok,
                     params=UnitParams(unit))]


def act(ctx: Acting, step: Step) -> None:
    unit = params(step, UnitParams).unit
    install.restart(ctx.t, unit)
    hoststate.clear_pending(ctx.t, unit)


STEP = StepKind(KIND, UnitParams, act, plan=plan)
