"""`payload.upgrade`: a venv that holds a DDTree payload other than the one this tool ships
(another version or content), or whose payload files were changed since, is upgraded in
place from the upstream originals in its backup (`payload/deploy.py`); a restart follows.

Planned before `payload.deploy`: where it plans a step, that one plans none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddtree_deploy.converge.steps import Acting, Params, Planning, Step, StepKind, params
from ddtree_deploy.converge.steps._release import refuse_unsupported
from ddtree_deploy.payload.manifest import load_manifest, shipped_identity
from ddtree_deploy.resources import data_path

KIND = "payload.upgrade"


@dataclass(frozen=True)
class PayloadUpgrade(Params):
    venv: str
    from_: str | None = field(default=None, metadata={"json": "from"})  # the old payload
    to: str | None = None  # the shipped one (both unset: its changed files reinstalled)


def wanted(ctx: Planning) -> bool:
    """Whether the deployment runs DDTree with the tool's payload."""
    return ctx.deployment.payload and ctx.deployment.algorithm == "ddtree"


def plan(ctx: Planning) -> list[Step]:
    if not wanted(ctx):
        return []
    form = refuse_unsupported(ctx)  # the declared release: the payload serves it, or exit 2
    sg = ctx.basis.sglang if ctx.basis is not None else None
    have = sg.payload if sg is not None else None
    if ctx.installing_sglang or sg is None or have is None or have.error:
        return []  # nothing there to upgrade (an unreadable state: payload.deploy says so)
    if have.form != form or (have.sglang is not None and have.sglang != sg.version):
        return []  # another form or release: payload.deploy takes the old one off first
    want = shipped_identity(sg.version)
    if want is None:
        return []
    now = (str(have.payload), str(have.version), have.digest)
    title = "DDTree payload"
    if now != want:
        same = now[:2] == want[:2]
        old, new = label(*now, content=same), label(*want, content=same)
        step = ctx.step(KIND, title, f"payload {old} is installed; this tool ships {new}",
                        [f"upgrade the payload in place: {old} -> {new}"],
                        params=PayloadUpgrade(ctx.venv, from_=old, to=new))
    elif not have.intact:
        step = ctx.step(KIND, title,
                        f"the files of payload {label(*want)} were changed since it was deployed",
                        [f"reinstall payload {label(*want)} from the upstream originals it "
                         "backed up"], params=PayloadUpgrade(ctx.venv))
    else:
        return []
    ctx.payload_planned = ctx.changed = True
    return [step]


def label(payload: str, version: str, digest: str | None, content: bool = False) -> str:
    return f"{payload} {version}" + (f" (content {digest or 'unrecorded'})" if content else "")


def act(ctx: Acting, step: Step) -> None:
    deploy_payload(ctx, params(step, PayloadUpgrade).venv)


def deploy_payload(ctx: Acting, venv: str) -> None:
    """The shipped payload onto `venv`: deployed, or upgraded in place over another."""
    from ddtree_deploy.converge.steps._install_uv import ensure_uv
    from ddtree_deploy.payload.deploy import deploy  # acting only: plan stays light

    manifest, folder = load_manifest(data_path("payload"))
    deploy(ctx.t, venv, manifest, folder, find_uv=lambda t: ensure_uv(t, sudo=False))


STEP = StepKind(KIND, PayloadUpgrade, act, plan=plan, marks_restart=True, keeps_facts=True)
