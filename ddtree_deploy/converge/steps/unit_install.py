"""`unit.install`: the deployment's systemd unit, rendered from hosts.yaml and the facts
(GPUs and port chosen or refused, LD_LIBRARY_PATH from the venv's real library folders),
verified with systemd-analyze on the host, installed atomically (`service/install.py`),
with the service's secret files (`service/endpoint.py`).

The step is pending when the unit differs or when the secrets' digest on the host (root-only,
read with the host state) differs from the workstation files' (a rotated key or token: apply
installs the files and restarts the service). A secret file that cannot be read does not
stop plan: this step is pending with the file and the reason, and fails with them in apply.

`service up` installs its unit with the same `install_unit`.
"""

from __future__ import annotations

from ddtree_deploy import __version__
from ddtree_deploy.config.schema import Deployment
from ddtree_deploy.converge.steps import Acting, Planning, Step, StepKind, UnitParams
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.service import endpoint, install
from ddtree_deploy.service.resolve import build_spec
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.transport.base import ExecTransport

KIND = "unit.install"


def unit_text(spec: ServiceSpec) -> str:
    """The unit file of `spec`, as this version of the tool renders it."""
    from ddtree_deploy.service.render import render_unit  # jinja2: only when rendered

    return render_unit(spec, tool_version=__version__)


def install_unit(t: ExecTransport, spec: ServiceSpec, deployment: Deployment | None = None
                 ) -> tuple[str, bool]:
    """Render, verify and install the unit of `spec` (its secret files first, from the
    deployment's files on the workstation): its text, and whether the file changed."""
    text = unit_text(spec)
    secrets = endpoint.read_secrets(deployment.api_key_file, deployment.hf_token_file,
                                    deployment.name) if deployment else endpoint.Secrets()
    endpoint.install_secrets(t, spec.name, secrets, spec.user)
    return text, install.install(t, spec.unit_name, text)


def listens(spec: ServiceSpec) -> str:
    """Where the service listens, said by plan: 0.0.0.0 is every interface."""
    where = f"listens on {spec.bind_host}:{spec.port}"
    if endpoint.is_open(spec.bind_host):
        where += " (every interface" + ("" if "api_key" in spec.secrets else
                                        ", no API key: anyone who reaches the port") + ")"
    return where


def _secrets_change(ctx: Planning, stem: str) -> tuple[str, str] | None:
    """Why the service's secret files on the host are not the workstation's (a reason and a
    change line, nothing of their content), or None when they are."""
    d = ctx.deployment
    try:
        secrets = endpoint.read_secrets(d.api_key_file, d.hf_token_file, d.name)
    except ConfigError as exc:
        return str(exc), "install the service's secret files: fails until the file is readable"
    have = ctx.state.secrets.get(stem)
    if endpoint.secrets_match(secrets, stem, have):
        return None
    if not secrets.kinds():
        return "secret files no longer wanted", f"remove {endpoint.folder(stem)}"
    return ("the secret files differ" if have else "no secret files installed",
            f"install the service's secret files in {endpoint.folder(stem)} (content not shown)")


def plan(ctx: Planning) -> list[Step]:
    d = ctx.deployment
    unit = d.unit_name
    spec = build_spec(ctx.config, ctx.host, ctx.facts, d, require_venv=False)
    secrets = _secrets_change(ctx, spec.name)
    if ctx.changed:
        return [ctx.step(KIND, unit, "rendered once the steps above are done (from the venv's "
                                     "real library folders)",
                         [f"install {spec.unit_path} ({listens(spec)})",
                          *([secrets[1]] if secrets else [])],
                         params=UnitParams(unit))]
    installed = ctx.state.units.get(unit)
    rendered = unit_text(spec)
    same = installed == rendered
    ctx.changed = not same
    changes = [] if same else [f"install {spec.unit_path} (GPU "
                               f"{','.join(map(str, spec.gpus))}, port {spec.port}; "
                               f"{listens(spec)})"]
    if installed is not None and not same:
        changes += unit_diff(installed, rendered)
    reason = f"installed unit matches ({listens(spec)})" if same else \
        ("no unit installed" if installed is None else "the unit differs")
    if secrets is not None:
        reason = secrets[0] if same else f"{reason}; {secrets[0]}"
        changes.append(secrets[1])
        ctx.changed = True
    return [ctx.step(KIND, unit, reason, changes, satisfied=not ctx.changed,
                     params=UnitParams(unit))]


DIFF_LINES = 60  # a unit differs in a few lines; a longer diff is said as a count past these


def unit_diff(installed: str, rendered: str) -> list[str]:
    """The installed unit against the one apply would install: its changed lines, old (`-`)
    then new (`+`), as a unified diff without context; the tool's comment lines (its version)
    left out. Units hold no secrets: render refuses them."""
    import difflib

    lines = [line for line in difflib.unified_diff(installed.splitlines(), rendered.splitlines(),
                                                   lineterm="", n=0)
             if not line.startswith(("---", "+++", "@@")) and not line[1:].startswith("#")]
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... {len(lines) - DIFF_LINES} more changed lines"]
    return [f"unit {line}" for line in lines]


def precheck(ctx: Acting, step: Step) -> None:
    """The deployment's secret files readable (ConfigError naming the file otherwise), before
    the runner marks the restart: a failure here leaves the host as it was."""
    dep = ctx.config.deployment(step.deployment)
    endpoint.read_secrets(dep.api_key_file, dep.hf_token_file, dep.name)


def act(ctx: Acting, step: Step) -> None:
    dep = ctx.config.deployment(step.deployment)
    install_unit(ctx.t, build_spec(ctx.config, ctx.host, ctx.facts.current(), dep), dep)


STEP = StepKind(KIND, UnitParams, act, plan=plan, marks_restart=True, precheck=precheck)
