"""`service.probe`: the deployment's health, checked after apply converged (a check, never a
change): the port and whether the server takes token ids are read back from the installed
unit, then the bounded probe of `health/check.py`; an unhealthy service fails the run.

`service up` and `probe` read a unit's probe target with the same `target_of`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddtree_deploy.converge.steps import Acting, Planning, Step, StepKind, UnitParams, params
from ddtree_deploy.errors import DeployError
from ddtree_deploy.service.spec import DEPLOYMENT_KEY, PORT_KEY

if TYPE_CHECKING:
    from ddtree_deploy.health.check import ProbeTarget

KIND = "service.probe"


def _unit_key(text: str, key: str) -> str | None:
    found = [ln.split("=", 1)[1].strip() for ln in text.splitlines() if ln.startswith(f"{key}=")]
    return found[0] if found and found[0] else None


def unit_port(text: str) -> int | None:
    """The port a unit's /health answers on (its X-DDTreeDeploy-Port line), if it says."""
    found = _unit_key(text, PORT_KEY)
    return int(found) if found and found.isdecimal() else None


def target_of(text: str, unit: str | None, host: str, port: int | None = None
              ) -> ProbeTarget | None:
    """What to probe for a unit of text `text` (`port` overrides its own), or None when
    no port is known."""
    from ddtree_deploy.health.check import ProbeTarget  # probing only: plan stays light

    port = port if port is not None else unit_port(text)
    if port is None:
        return None
    ids = True if "--skip-tokenizer-init" in text else None  # the server takes input_ids
    bind = _flag(text, "--host")
    # the deployment it serves: remedies name it (`service up HOST DEPLOYMENT ...`); the
    # address it binds when that is one address (else loopback); its API key's file
    return ProbeTarget(port=port, unit=unit, host=host, input_ids=ids,
                       deployment=_unit_key(text, DEPLOYMENT_KEY),
                       addr=bind if bind and bind not in ("0.0.0.0", "::", "[::]") else
                       "127.0.0.1", key_file=_flag(text, "--config"))


def _flag(text: str, flag: str) -> str | None:
    """The value of `flag` on the unit's ExecStart lines (one flag per line, as rendered)."""
    for line in text.splitlines():
        words = line.strip().rstrip("\\").split()
        if len(words) >= 2 and words[0] == flag:
            return words[1].strip('"')
    return None


def plan(ctx: Planning) -> list[Step]:
    unit = ctx.deployment.unit_name
    return [ctx.step(KIND, f"{unit} health",
                     "checked after apply (/health, a greedy and a sampled generation)",
                     params=UnitParams(unit))]


def act(ctx: Acting, step: Step) -> str:
    from ddtree_deploy.health.check import probe_service
    from ddtree_deploy.service import install

    unit, host = params(step, UnitParams).unit, ctx.host.name
    target = target_of(install.current_text(ctx.t, unit) or "", unit, host)
    if target is None:
        raise DeployError(f"{host}: {unit} has no port in its unit")
    verdict = probe_service(ctx.t, target, deadline_s=ctx.probe_deadline)
    if verdict.status != "healthy":
        why = "; ".join(f"{m.diagnosis} (fix: {m.remedy})" for m in verdict.diagnosis)
        raise DeployError(f"{host}: {unit} is {verdict.status}: {verdict.reason}"
                          + (f" — {why}" if why else ""))
    return verdict.reason


STEP = StepKind(KIND, UnitParams, act, plan=plan, check=True,
                says=lambda step: f"probing {params(step, UnitParams).unit}")
