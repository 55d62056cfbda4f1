"""`unit.remove`: a unit this tool created for a deployment that is no longer in hosts.yaml
is stopped, disabled and removed (units it did not create are never touched)."""

from __future__ import annotations

from ddtree_deploy.converge import hoststate
from ddtree_deploy.converge.steps import (
    Acting,
    HostPlanning,
    Step,
    StepKind,
    UnitParams,
    params,
)
from ddtree_deploy.service import install

KIND = "unit.remove"


def plan_host(ctx: HostPlanning) -> list[Step]:
    wanted = {d.unit_name for d in ctx.config.deployments_on(ctx.host)}
    return [Step(KIND, ctx.host.name, dep, unit,
                 f"deployment '{dep}' is no longer in {ctx.config.path}",
                 [f"stop, disable and remove {unit}"], params=UnitParams(unit))
            for unit, dep in sorted(ctx.state.managed.items())
            if dep and dep not in ctx.config.deployments and unit not in wanted]


def act(ctx: Acting, step: Step) -> None:
    unit = params(step, UnitParams).unit
    install.down(ctx.t, unit, remove=True)
    hoststate.clear_pending(ctx.t, unit)


STEP = StepKind(KIND, UnitParams, act, plan_host=plan_host)
