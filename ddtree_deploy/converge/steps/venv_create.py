"""`venv.create`: the deployment's venv, cloned from another venv of the host (as the story
did by hand) or made new with the python hosts.yaml names.

Planned on the facts: a venv that exists is satisfied; for one to clone, the later steps
are planned on the clone's source (what the clone will hold).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddtree_deploy.converge.steps import Acting, Params, Planning, Step, StepKind, params
from ddtree_deploy.converge.steps._venv_clone import clone
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.transport import Command

KIND = "venv.create"


@dataclass(frozen=True)
class VenvCreate(Params):
    venv: str
    clone: str | None = None  # the venv to copy; else a new venv of `python`
    python: str | None = None


def plan(ctx: Planning) -> list[Step]:
    host, d, path = ctx.host, ctx.deployment, ctx.venv
    title = f"venv {path}"
    found = ctx.facts.venv(path)
    if found is not None and found.exists:
        ctx.basis = found
        return [ctx.step(KIND, title, f"{path} exists", satisfied=True)]
    create = host.venvs[d.venv].create
    if create is None:
        raise ConfigError(f"{d.name}: venv {path} does not exist on {host.name} and hosts.yaml "
                          f"says not how to make it (hosts.{host.name}.venvs.{d.venv}.create)")
    ctx.changed = True
    if create.clone:
        src = str(host.venvs[create.clone].path)
        ctx.basis = ctx.facts.venv(src)
        return [ctx.step(KIND, title, f"{path} does not exist on {host.name}",
                         [f"clone {src} -> {path}"], params=VenvCreate(path, clone=src))]
    ctx.basis = None
    return [ctx.step(KIND, title, f"{path} does not exist on {host.name}",
                     [f"new venv with python {create.python}"],
                     params=VenvCreate(path, python=str(create.python)))]


def act(ctx: Acting, step: Step) -> None:
    p = params(step, VenvCreate)
    if p.clone is not None:
        clone(ctx.t, p.clone, p.venv)
    else:
        ctx.t.run(Command.of(f"python{p.python}", "-m", "venv", p.venv, sudo=True),
                  timeout=600).check()


STEP = StepKind(KIND, VenvCreate, act, plan=plan, marks_restart=True)
