"""`package.install`: sglang and the deployment's extra packages in its venv, installed with
uv on the host from wheels the workstation downloads (`_install.py`, `_install_uv.py`).

sglang comes without its dependencies (the lane and the extras bring them); an extra's
dependencies are followed on the workstation without the lane's own distributions
(`_install_deps.py`) and installed with it, each pinned.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement as Pep508
from packaging.utils import canonicalize_name

from ddtree_deploy.config.hosts import Deployment
from ddtree_deploy.converge.steps import Acting, Params, Planning, Step, StepKind, params
from ddtree_deploy.converge.steps._install import Requirement, install, satisfied, wheelhouse
from ddtree_deploy.converge.steps._install_deps import closure, pinned
from ddtree_deploy.converge.steps._release import lacking, refuse_conflicts

KIND = "package.install"


@dataclass(frozen=True)
class PackageInstall(Params):
    venv: str
    requirement: str  # PEP 508
    deps: bool  # with the dependencies it lacks (never the lane's)


def requirements(d: Deployment) -> list[tuple[str, bool]]:
    """(requirement, with its dependencies) the deployment needs in its venv."""
    return [(f"sglang=={d.sglang.version}", False)] + [(str(x), True)
                                                      for x in d.sglang.extra_packages]


def plan(ctx: Planning) -> list[Step]:
    refuse_conflicts(ctx)
    dists = ctx.basis.distributions if ctx.basis is not None else {}
    steps = []
    for req, deps in requirements(ctx.deployment):
        name = Pep508(req).name
        if satisfied(req, dists):
            steps.append(ctx.step(KIND, req, f"{name} {dists.get(canonicalize_name(name), '')} "
                                             f"satisfies {req}".replace("  ", " "),
                                  satisfied=True))
            continue
        installed = dists.get(canonicalize_name(name))
        wanted = str(Pep508(req).specifier) or "any version"
        changes = [f"uv pip install {'--no-deps ' if not deps else ''}{req}",
                   f"{name}: {installed or 'not installed'} -> {wanted}"]
        note = lacking(ctx) if not deps and canonicalize_name(name) == "sglang" else None
        steps.append(ctx.step(KIND, req, f"{name} is "
                                         f"{'at ' + installed if installed else 'not installed'}"
                                         f" in {ctx.venv}",
                              changes + ([note] if note else []),
                              params=PackageInstall(ctx.venv, req, deps)))
        # A missing package only needs installing: the unit does not change, and a running
        # service already holds what it imported (a crashed one restarts on its own).
        ctx.installing_sglang = ctx.installing_sglang or canonicalize_name(name) == "sglang"
    return steps


def act(ctx: Acting, step: Step) -> None:
    from ddtree_deploy.overlay.lanefile import load_lane  # acting only: plan stays light

    p = params(step, PackageInstall)
    now = ctx.facts.current()  # python, glibc; what the venv has (after venv/lane steps)
    venv = now.venv(p.venv)
    pyver = (venv.python_version if venv else None) or "3.11"
    lane_ = load_lane(ctx.config.deployment(step.deployment).cuda_lane)
    have = venv.distributions if venv else {}
    if p.deps:
        wheels = closure(p.requirement, have,
                         lambda n: lane_.includes(n) or lane_.supersedes_name(n),
                         python_version=pyver, glibc=now.host_info.glibc, beside=ctx.t)
    else:
        wheels = wheelhouse([Requirement(p.requirement, False)],
                            python_version=pyver, glibc=now.host_info.glibc, beside=ctx.t)
    install(ctx.t, p.venv, pinned(wheels), wheels, sudo=ctx.host.use_sudo)
    if adds_library_folders(wheels):
        ctx.facts.stale()  # new nvidia/*/lib folders: the unit's LD_LIBRARY_PATH must see them


def adds_library_folders(wheels: list[Path]) -> bool:
    """Whether a wheel puts files in nvidia/<component>/lib, the folders a unit's
    LD_LIBRARY_PATH is made of (read from the wheels' zip directories)."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if any(_NVIDIA_LIB.match(n) for n in zf.namelist()):
                return True
    return False


_NVIDIA_LIB = re.compile(r"nvidia/[^/]+/lib/")

STEP = StepKind(KIND, PackageInstall, act, plan=plan, keeps_facts=True)
