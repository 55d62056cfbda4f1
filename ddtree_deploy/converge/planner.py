"""The steps that take one host from its facts to the deployments hosts.yaml declares there.

Pure: facts, host state and the hosts file in, steps out. A step whose inputs will only
exist after an earlier step (a venv yet to be cloned, a lane yet to be overlaid) is
planned on what that earlier step will produce: the clone's source venv, the lane.
"""

from __future__ import annotations

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ddtree_deploy import __version__
from ddtree_deploy.config import Config, Deployment, HostSpec
from ddtree_deploy.converge.hoststate import HostState
from ddtree_deploy.converge.steps import Step
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.facts.model import Facts, SglangInfo, Venv
from ddtree_deploy.installer import satisfied
from ddtree_deploy.rules.lane import lane


def requirements(d: Deployment) -> list[tuple[str, bool]]:
    """(requirement, with its dependencies) the deployment needs in its venv."""
    return [(f"sglang=={d.sglang.version}", False)] + [(str(x), True)
                                                      for x in d.sglang.extra_packages]


def _venv_steps(host: HostSpec, d: Deployment, facts: Facts) -> tuple[list[Step], Venv | None]:
    path = str(host.venvs[d.venv].path)
    found = facts.venv(path)
    if found is not None and found.exists:
        return [Step("venv.create", host.name, d.name, f"venv {path}",
                     f"{path} exists", satisfied=True)], found
    create = host.venvs[d.venv].create
    if create is None:
        raise ConfigError(f"{d.name}: venv {path} does not exist on {host.name} and hosts.yaml "
                          f"says not how to make it (hosts.{host.name}.venvs.{d.venv}.create)")
    if create.clone:
        src = str(host.venvs[create.clone].path)
        basis = facts.venv(src)
        return [Step("venv.create", host.name, d.name, f"venv {path}",
                     f"{path} does not exist on {host.name}", [f"clone {src} -> {path}"],
                     params={"venv": path, "clone": src})], basis
    return [Step("venv.create", host.name, d.name, f"venv {path}",
                 f"{path} does not exist on {host.name}",
                 [f"new venv with python {create.python}"],
                 params={"venv": path, "python": str(create.python)})], None


def plan_deployment(config: Config, host: HostSpec, d: Deployment, facts: Facts,
                    state: HostState) -> list[Step]:
    path = str(host.venvs[d.venv].path)
    steps, basis = _venv_steps(host, d, facts)
    changed = not steps[0].satisfied
    report = lane(basis) if basis is not None else None
    if report is not None and report.lane == d.cuda_lane and not report.mixed:
        steps.append(Step("lane.overlay", host.name, d.name, f"CUDA lane {d.cuda_lane}",
                          f"torch {basis.torch.version if basis and basis.torch else '?'} is the "
                          f"{d.cuda_lane} lane", satisfied=True))
    else:
        have = "no torch" if report is None or report.lane is None else (
            f"mixed {'+'.join(f'cu{m}' for m in sorted(report.majors))}" if report.mixed
            else report.lane)
        steps.append(Step("lane.overlay", host.name, d.name, f"CUDA lane {d.cuda_lane}",
                          f"the venv's lane is {have}; the deployment needs {d.cuda_lane}",
                          [f"overlay the {d.cuda_lane} lane into {path}"],
                          params={"venv": path, "lane": d.cuda_lane}))
        changed = True
    dists = basis.distributions if basis is not None else {}
    installing_sglang = False
    for req, deps in requirements(d):
        name = Requirement(req).name
        if satisfied(req, dists):
            steps.append(Step("package.install", host.name, d.name, req,
                              f"{name} {dists.get(canonicalize_name(name), '')} satisfies "
                              f"{req}".replace("  ", " "),
                              satisfied=True))
            continue
        installed = dists.get(canonicalize_name(name))
        steps.append(Step("package.install", host.name, d.name, req,
                          f"{name} is {'at ' + installed if installed else 'not installed'} in "
                          f"{path}",
                          [f"uv pip install {'--no-deps ' if not deps else ''}{req}"],
                          params={"venv": path, "requirement": req, "deps": deps}))
        # A missing package only needs installing: the unit does not change, and a running
        # service already holds what it imported (a crashed one restarts on its own).
        installing_sglang = installing_sglang or canonicalize_name(name) == "sglang"
    if d.payload and d.algorithm == "ddtree":
        sg = basis.sglang if basis is not None else None
        step = _payload_upgrade(host, d, path, sg) if not installing_sglang else None
        if step is None:
            ok = (not installing_sglang and sg is not None and bool(sg.knows_ddtree)
                  and bool(sg.ddtree_is_dflash))
            step = Step("payload.deploy", host.name, d.name, "DDTree payload",
                        "DDTREE is known and counts as DFlash" if ok else
                        "sglang's SpeculativeAlgorithm does not know DDTREE yet",
                        [] if ok else [f"payload deploy onto {path}"], satisfied=ok,
                        params={"venv": path})
        steps.append(step)
        changed = changed or not step.satisfied
    steps += _service_steps(config, host, d, facts, state, changed)
    return steps


def _payload_upgrade(host: HostSpec, d: Deployment, path: str, sg: SglangInfo | None
                     ) -> Step | None:
    """The step for a venv that holds a payload other than the one this tool ships (another
    version or content), whose payload files were changed since, or whose payload state
    cannot be read; None when it holds none or the shipped one intact."""
    from ddtree_deploy.payload.manifest import shipped_identity

    have = sg.payload if sg is not None else None
    if sg is None or have is None:
        return None
    if have.error:
        return Step("payload.deploy", host.name, d.name, "DDTree payload",
                    f"the venv's payload state cannot be read: {have.error}",
                    [f"payload deploy onto {path} (refused until the state is fixed)"],
                    params={"venv": path})
    want = shipped_identity(sg.version)
    if want is None:
        return None
    now = (str(have.payload), str(have.version), have.digest)
    if now != want:
        same = now[:2] == want[:2]
        old, new = _label(*now, content=same), _label(*want, content=same)
        return Step("payload.upgrade", host.name, d.name, "DDTree payload",
                    f"payload {old} is installed; this tool ships {new}",
                    [f"upgrade the payload in place: {old} -> {new}"],
                    params={"venv": path, "from": old, "to": new})
    if not have.intact:
        return Step("payload.upgrade", host.name, d.name, "DDTree payload",
                    f"the files of payload {_label(*want)} were changed since it was deployed",
                    [f"reinstall payload {_label(*want)} from the upstream originals it backed "
                     "up"], params={"venv": path})
    return None


def _label(payload: str, version: str, digest: str | None, content: bool = False) -> str:
    return f"{payload} {version}" + (f" (content {digest or 'unrecorded'})" if content else "")


def _service_steps(config: Config, host: HostSpec, d: Deployment, facts: Facts,
                   state: HostState, changed: bool) -> list[Step]:
    from ddtree_deploy.service.resolve import Overrides, build_spec

    unit = d.unit_name
    spec = build_spec(host, facts, d, Overrides(), require_venv=False)
    installed = state.units.get(unit)
    steps = []
    if changed:
        steps.append(Step("unit.install", host.name, d.name, unit,
                          "rendered once the steps above are done (from the venv's real "
                          "library folders)", [f"install {spec.unit_path}"],
                          params={"unit": unit}))
    else:
        from ddtree_deploy.service.render import render_unit  # jinja2: only when compared

        text = render_unit(spec, tool_version=__version__)
        same = installed == text
        steps.append(Step("unit.install", host.name, d.name, unit,
                          "installed unit matches" if same else
                          ("no unit installed" if installed is None else "the unit differs"),
                          [] if same else [f"install {spec.unit_path} (GPU "
                                           f"{','.join(map(str, spec.gpus))}, "
                                           f"port {spec.port})"], satisfied=same,
                          params={"unit": unit}))
        changed = not same
    active = any(u.name == unit and u.active == "active" for u in facts.services.units)
    pending = unit in state.pending
    start_ok = active and not changed and not pending
    reason = ("active and up to date" if start_ok else
              "a restart is pending from an earlier run" if pending else
              "the steps above change what it runs" if changed else f"{unit} is not active")
    steps.append(Step("service.start", host.name, d.name, unit, reason,
                      [] if start_ok else [f"restart {unit}"], satisfied=start_ok,
                      params={"unit": unit}))
    steps.append(Step("service.probe", host.name, d.name, f"{unit} health",
                      "checked after apply (/health, a greedy and a sampled generation)",
                      params={"unit": unit}))
    return steps


def plan_host(config: Config, host: HostSpec, facts: Facts, state: HostState) -> list[Step]:
    steps: list[Step] = []
    for d in config.deployments_on(host):
        steps += plan_deployment(config, host, d, facts, state)
    wanted = {d.unit_name for d in config.deployments_on(host)}
    for unit, dep in sorted(state.managed.items()):
        if dep and dep not in config.deployments and unit not in wanted:
            steps.append(Step("unit.remove", host.name, dep, unit,
                              f"deployment '{dep}' is no longer in {config.path}",
                              [f"stop, disable and remove {unit}"], params={"unit": unit}))
    return steps
