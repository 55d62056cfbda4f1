"""`payload.deploy`: the DDTree runtime onto the venv's sglang (`payload/deploy.py`), for a
deployment of algorithm ddtree with `payload: true`.

Satisfied when sglang's SpeculativeAlgorithm knows DDTREE and counts it as DFlash (and
no sglang install is planned before it); a payload state that cannot be read is planned
as a deploy that the deploy itself refuses until it is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddtree_deploy.converge.steps import Acting, Params, Planning, Step, StepKind, params
from ddtree_deploy.converge.steps._release import refuse_unsupported
from ddtree_deploy.converge.steps.payload_upgrade import deploy_payload, wanted
from ddtree_deploy.facts.model import PayloadInfo
from ddtree_deploy.payload.manifest import shipped_identity

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
    if refuse_unsupported(ctx) == "plugin":
        return _plan_plugin(ctx, have, p)
    ok = (not ctx.installing_sglang and sg is not None and bool(sg.knows_ddtree)
          and bool(sg.ddtree_is_dflash))
    ctx.changed = ctx.changed or not ok
    return [ctx.step(KIND, title, "DDTREE is known and counts as DFlash" if ok else
                     "sglang's SpeculativeAlgorithm does not know DDTREE yet",
                     [] if ok else [f"payload deploy onto {ctx.venv}"], satisfied=ok, params=p)]


def _plan_plugin(ctx: Planning, have: PayloadInfo | None, p: PayloadDeploy) -> list[Step]:
    """sglang 0.5.17+: the plugin wheel, which SGLang loads through its entry point."""
    want = shipped_identity(ctx.deployment.sglang.version)
    now = None if have is None else (have.payload, have.version, have.digest)
    ok = (not ctx.installing_sglang and have is not None and have.form == "plugin"
          and bool(have.intact) and now == want
          and have.sglang in (None, ctx.deployment.sglang.version))
    ctx.changed = ctx.changed or not ok
    name = f"{want[0]} {want[1]}" if want else "the DDTree plugin"
    if ok:
        return [ctx.step(KIND, "DDTree plugin", f"{name} is installed (SGLang loads it through "
                         "its sglang.srt.plugins entry point)", satisfied=True, params=p)]
    why = "no DDTree plugin is installed" if have is None else (
        f"the venv holds the {have.form} form {have.payload} {have.version}"
        + (f" made for sglang {have.sglang}" if have.sglang else ""))
    changes = [f"payload deploy onto {ctx.venv}: the {name} wheel installed with uv (the "
               "venv's pip where uv cannot be pushed), nothing written into sglang"]
    if have is not None and have.form == "patch":
        changes.append("the patch set's leftovers removed first (files the new sglang does not "
                       "list), its backup dropped")
    return [ctx.step(KIND, "DDTree plugin", why, changes, params=p)]


def act(ctx: Acting, step: Step) -> None:
    deploy_payload(ctx, params(step, PayloadDeploy).venv)


STEP = StepKind(KIND, PayloadDeploy, act, plan=plan, marks_restart=True, keeps_facts=True)
