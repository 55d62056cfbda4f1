"""`lane.overlay`: the deployment's CUDA lane (torch and the libraries built for one CUDA
major) moved into its venv from a venv that has it (`overlay/`).

Planned on the venv as the earlier steps leave it: satisfied when its torch is of the
deployment's lane and no compiled extension is of another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddtree_deploy.converge.steps import Acting, Params, Planning, Step, StepKind, params
from ddtree_deploy.rules.venv_lane import lane

KIND = "lane.overlay"


@dataclass(frozen=True)
class LaneOverlay(Params):
    venv: str
    lane: str  # cu128, cu130: overlays/<lane>.yaml


def plan(ctx: Planning) -> list[Step]:
    d, basis = ctx.deployment, ctx.basis
    title = f"CUDA lane {d.cuda_lane}"
    report = lane(basis) if basis is not None else None
    if report is not None and report.lane == d.cuda_lane and not report.mixed:
        return [ctx.step(KIND, title,
                         f"torch {basis.torch.version if basis and basis.torch else '?'} is the "
                         f"{d.cuda_lane} lane", satisfied=True)]
    have = "no torch" if report is None or report.lane is None else (
        f"mixed {'+'.join(f'cu{m}' for m in sorted(report.majors))}" if report.mixed
        else report.lane)
    ctx.changed = True
    return [ctx.step(KIND, title, f"the venv's lane is {have}; the deployment needs "
                                  f"{d.cuda_lane}",
                     [f"overlay the {d.cuda_lane} lane into {ctx.venv}"],
                     params=LaneOverlay(ctx.venv, d.cuda_lane))]


def act(ctx: Acting, step: Step) -> None:
    # What acting needs is imported when it acts (zstandard among it): plan stays light.
    from ddtree_deploy.overlay.blobcache import BlobCache
    from ddtree_deploy.overlay.lanefile import load_lane
    from ddtree_deploy.overlay.run import run_overlay

    p = params(step, LaneOverlay)

    def phase(status: dict[str, Any]) -> None:  # the host's journal: backing-up, checking...
        journal = status.get("journal")
        if isinstance(journal, dict) and journal.get("phase"):
            ctx.note(f"on the host: {journal['phase']}")

    run_overlay(ctx.config, load_lane(p.lane), ctx.host.name, p.venv, cache=BlobCache(),
                progress=ctx.progress, on_status=phase, ears=ctx.t)


STEP = StepKind(KIND, LaneOverlay, act, plan=plan, marks_restart=True)
