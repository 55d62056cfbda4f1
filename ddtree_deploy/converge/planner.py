"""The steps that take one host from its facts to the deployments hosts.yaml declares there.

Pure: facts, host state and the hosts file in, steps out. Every step kind plans its own
part (`steps/<kind>.py`), in the registry's order; a step whose inputs will only exist
after an earlier step (a venv yet to be cloned, a lane yet to be overlaid) is planned on
what that earlier step will produce: the clone's source venv, the lane.
"""

from __future__ import annotations

from ddtree_deploy.config.hosts import Config, Deployment, HostSpec
from ddtree_deploy.config.roles import refuse_write
from ddtree_deploy.converge.hoststate import HostState
from ddtree_deploy.converge.steps import HostPlanning, Planning, Step, registry
from ddtree_deploy.facts.model import Facts

# the kinds that write into the deployment's venv (refused in a source or training venv)
WRITES_VENV = ("venv.create", "lane.overlay", "package.install", "payload.upgrade",
               "payload.deploy")


def plan_deployment(config: Config, host: HostSpec, d: Deployment, facts: Facts,
                    state: HostState) -> list[Step]:
    ctx = Planning(config, host, facts, state, d, str(host.venvs[d.venv].path))
    steps: list[Step] = []
    for kind in registry():
        if kind.plan is not None:
            steps += kind.plan(ctx)
    writes = [s for s in steps if s.pending and s.kind in WRITES_VENV]
    if writes:
        refuse_write(host, ctx.venv, f"deployment {d.name}'s "
                     + ", ".join(f"{s.kind} ({s.title})" for s in writes))
    return steps


def plan_host(config: Config, host: HostSpec, facts: Facts, state: HostState) -> list[Step]:
    steps: list[Step] = []
    for d in config.deployments_on(host):
        steps += plan_deployment(config, host, d, facts, state)
    ctx = HostPlanning(config, host, facts, state)
    for kind in registry():
        if kind.plan_host is not None:
            steps += kind.plan_host(ctx)
    return steps
