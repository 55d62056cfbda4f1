"""`payload.deploy`: the DDTree runtime onto the venv's sglang (`payload/deploy.py`), for a
deployment of algorithm ddtree with `payload: true`.

Satisfied when sglang's SpeculativeAlgorithm knows DDTREE and counts it as DFlash (and
no sglang install is planned before it); a payload state that cannot be read is planned
as a deploy that the deploy itself refuses until it is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddtree_deploy.converge.steps import Acting, Params, Planning, Step, StepKind, params
from ddtree_deploy.converge.steps.payload_upgrade import deploy_payload, wanted

KIND = "payload.deploy"


@dataclass(frozen=True)
class PayloadDeploy(Params):
    venv: str


def plan(ctx: Planning) -> list[Step]:
    if not wanted(ctx) or ctx.payload_planned:
        return []
    sg = ctx.basis.sglang if ctx.basis is not None else None
    title, p = "DDTree payload", PayloadDeploy(ctx.venv)
    have = sg.payload if sg is not None else None
    if not ctx.installing_sglang and have is not None and have.error:
        ctx.changed = True
        return [ctx.step(KIND, title, f"the venv's payload state cannot be read: {have.error}",
                         [f"payload deploy onto {ctx.venv} (refused until the state is fixed)"],
                         params=p)]
    ok = (not ctx.installing_sglang and sg is not None and bool(sg.knows_ddtree)
          and bool(sg.ddtree_is_dflash))
    ctx.changed = ctx.changed or not ok
    return [ctx.step(KIND, title, "DDTREE is known and counts as DFlash" if ok else
                     "sglang's SpeculativeAlgorithm does not know DDTREE yet",
                     [] if ok else [f"payload deploy onto {ctx.venv}"], satisfied=ok, params=p)]


def act(ctx: Acting, step: Step) -> None:
    deploy_payload(ctx, params(step, PayloadDeploy).venv)


STEP = StepKind(KIND, PayloadDeploy, act, plan=plan, marks_restart=True, keeps_facts=True)
