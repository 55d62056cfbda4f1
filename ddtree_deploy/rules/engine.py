"""diagnose(): run every rule over the facts and return the findings, error first.

Which venvs are judged: the one named by ``venv`` (a path on the host); with neither a
venv nor a deployment, every venv in the facts. Deployment rules run only when a
deployment is given; the caller resolves the deployment's venv name to its path (through
hosts.yaml) and passes it as ``venv``, so the deployment's needs are checked against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ddtree_deploy.config.schema import Deployment, VenvSpec
from ddtree_deploy.facts.model import Facts, Venv
from ddtree_deploy.rules import findings
from ddtree_deploy.rules.checks import HOST_RULES, VENV_RULES
from ddtree_deploy.rules.context import Rule, RuleContext
from ddtree_deploy.rules.deploy_checks import DEPLOY_HOST_RULES, DEPLOY_VENV_RULES
from ddtree_deploy.rules.findings import Finding, has_error, sort_findings
from ddtree_deploy.rules.model_fit import ModelFacts, check_model_fit
from ddtree_deploy.rules.venv_lane import lane


def _targets(
    facts: Facts, venv: str | None, deployment: Deployment | None
) -> list[tuple[str, Venv | None]]:
    if venv is not None:
        return [(venv, facts.venv(venv))]
    if deployment is None:
        return [(v.path, v) for v in sorted(facts.venvs, key=lambda v: v.path)]
    return []


def _venv_missing(ctx: RuleContext) -> Finding:
    dep = ctx.deployment
    known = sorted(v.path for v in ctx.facts.venvs if v.exists)
    if dep is not None:
        remedy = (
            f"create it: {findings.venv_clone(ctx.host, 'SOURCE', ctx.path)} with SOURCE a venv "
            f"to copy ({', '.join(known) or 'none found'}), or declare venvs."
            f"{dep.venv}.create in hosts.yaml and run {findings.apply(ctx.host, dep.name)})"
        )
    else:
        remedy = f"check the path; the venvs the probe found: {', '.join(known) or 'none'}"
    return Finding(
        id="venv.missing", severity="error",
        message=f"venv {ctx.path} does not exist on {ctx.host}",
        evidence={"venv": ctx.path, "known_venvs": known,
                  "error": ctx.venv.error if ctx.venv else None},
        remedy=remedy,
    )  # fmt: skip


def _run(rules: Iterable[Rule], ctx: RuleContext) -> list[Finding]:
    return [finding for rule in rules for finding in rule(ctx)]


def diagnose(
    facts: Facts,
    *,
    venv: str | None = None,
    deployment: Deployment | None = None,
    model_facts: ModelFacts | None = None,
    venv_spec: VenvSpec | None = None,
) -> list[Finding]:
    """Every finding about the host (and the venv, the deployment, the models), error first."""
    targets = _targets(facts, venv, deployment)
    lanes: list[tuple[str, str]] = []
    for path, found in targets:
        report = lane(found) if found is not None and found.exists else None
        if report is not None and report.lane:
            lanes.append((path, report.lane))
    if deployment is not None:
        lanes.append((f"deployment {deployment.name}", deployment.cuda_lane))
    base = RuleContext(facts, deployment=deployment, model_facts=model_facts, lanes=tuple(lanes),
                       venv_spec=venv_spec)

    out = _run(HOST_RULES, replace(base, venv_path=venv))
    for path, found in targets:
        ctx = base.with_venv(path, found)
        if found is None or not found.exists:
            out.append(_venv_missing(ctx))
            continue
        out += _run(VENV_RULES, ctx)
        if deployment is not None:
            out += _run(DEPLOY_VENV_RULES, ctx)
    if deployment is not None:
        first: tuple[str | None, Venv | None] = targets[0] if targets else (None, None)
        out += _run(DEPLOY_HOST_RULES, base.with_venv(*first))
    if model_facts is not None:
        out += check_model_fit(model_facts, deployment.algorithm if deployment else "none",
                               facts.host)
    return sort_findings(out)


def exit_code(findings: Iterable[Finding]) -> int:
    """doctor's exit status: 1 when any finding is an error, else 0."""
    return 1 if has_error(findings) else 0
