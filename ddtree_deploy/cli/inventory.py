"""`ddtree-deploy inventory` and `ddtree-deploy doctor` (thin: parse, call, render)."""

from __future__ import annotations

import contextlib

import typer

from ddtree_deploy.cli.common import (
    WIDE_HELP,
    config_of,
    console,
    host_failure,
    hosts_or_all,
    is_tty,
    print_results,
)
from ddtree_deploy.errors import DeployError, ExitCode, UsageError
from ddtree_deploy.facts.cache import DEFAULT_MAX_AGE_S, FactsCache
from ddtree_deploy.facts.gather import collect
from ddtree_deploy.transport.fanout import exit_code

out = console()
err = console(stderr=True)
TROUBLESHOOTING = "docs/troubleshooting.md"  # keyed by finding id (scripts/gen_troubleshooting.py)

REFRESH = typer.Option(False, "--refresh", help="gather new facts even when cached ones are fresh")
MAX_AGE = typer.Option(DEFAULT_MAX_AGE_S, "--max-age", min=0,
                       help="seconds cached facts stay fresh")
AS_JSON = typer.Option(False, "--json")


def inventory(
    ctx: typer.Context,
    hosts: list[str] = typer.Argument(None, help="hosts (default: every host of the hosts file)"),
    refresh: bool = REFRESH,
    max_age: float = MAX_AGE,
    as_json: bool = AS_JSON,
    concurrency: int = typer.Option(8, "--concurrency", min=1, max=64,
                                    help="hosts asked at once"),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
) -> None:
    """Know every host before touching it: GPUs (busy, dead), venvs and their CUDA lanes."""
    config = config_of(ctx)
    names = hosts_or_all(config, hosts)
    with err.status(f"gathering facts from {len(names)} host(s) ...") if is_tty(err) \
            else contextlib.nullcontext():
        outcomes = collect(config, names, cache=FactsCache(), refresh=refresh, max_age_s=max_age,
                           concurrency=concurrency)
    code = exit_code(outcomes)  # 3 only when some hosts answered and others did not
    if as_json:
        from ddtree_deploy.isotime import utc_iso

        print_results(out, [
            {**o.value.shown(), "ok": True,
             "taken_at": utc_iso(o.value.taken_at)} if o.value is not None
            else host_failure(o.host, o.error or DeployError("no facts"))
            for o in outcomes
        ], int(code))
        return
    else:
        from ddtree_deploy.cli.render_inventory import (
            WIDE,
            failures,
            gpu_table,
            part_errors,
            venv_table,
        )
        from ddtree_deploy.cli.render_table import show

        width = out.width if is_tty(out) and not wide else max(WIDE, out.width)
        show(out, gpu_table(outcomes), venv_table(outcomes, width=width),
             *part_errors(outcomes), *failures(outcomes), wide=wide)
    if code:
        raise typer.Exit(int(code))


def doctor(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="the host to examine"),
    venv: str = typer.Option(None, "--venv", help="examine this venv (a path on the host)"),
    deployment: str = typer.Option(None, "--deployment",
                                   help="check against what this deployment needs"),
    refresh: bool = REFRESH,
    max_age: float = MAX_AGE,
    as_json: bool = AS_JSON,
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
) -> None:
    """Findings for a host (and one venv or deployment), each with evidence and a remedy."""
    from ddtree_deploy.rules.engine import diagnose
    from ddtree_deploy.rules.model_fit import model_facts_from

    config = config_of(ctx)
    spec = config.host(host)
    dep = config.deployment(deployment) if deployment else None
    if dep is None and venv is not None and len(config.deployments_on(spec)) == 1:
        # One deployment on this host: check the venv against what it needs.
        dep = config.deployments_on(spec)[0]
        err.print(f"checking against deployment '{dep.name}' (the only one on {spec.name}); "
                  "--deployment picks another", markup=False, highlight=False)
    if dep is not None and dep.host != spec.name:
        raise UsageError(f"deployment '{deployment}' runs on {dep.host}, not on {spec.name}")
    if dep is not None and venv is None:
        venv = str(spec.venvs[dep.venv].path)
    extra = {spec.name: [venv]} if venv else None
    (outcome,) = collect(config, [spec.name], cache=FactsCache(), refresh=refresh,
                         max_age_s=max_age, extra_venvs=extra)
    if outcome.value is None:
        assert outcome.error is not None
        raise outcome.error
    model_facts = None
    if dep is not None:
        model_facts = model_facts_from(
            outcome.value,
            str(dep.model_path) if dep.model_path else None,
            str(dep.draft_model_path) if dep.draft_model_path else None,
        )
    findings = diagnose(outcome.value, venv=venv, deployment=dep, model_facts=model_facts,
                        venv_spec=spec.venvs.get(dep.venv) if dep is not None else None)
    code = int(ExitCode.FAILED) if any(f.severity == "error" for f in findings) else 0
    if as_json:
        print_results(out, {
            "host": spec.name,
            "venv": venv,
            "findings": [f.to_json() for f in findings],
        }, code)
        return
    else:
        from ddtree_deploy.cli.render_inventory import findings_table, remedies
        from ddtree_deploy.cli.render_table import show

        show(out, findings_table(spec.name, venv, findings), wide=wide)
        for line in remedies(findings):
            out.print(line, soft_wrap=True)
        shown = [f.id for f in findings if f.severity != "info"]
        if shown:  # on stderr: a pipe reading the findings gets only them
            err.print(f"each id explained: {TROUBLESHOOTING}#{shown[0]} (and the others there)",
                      markup=False, highlight=False, soft_wrap=True)
    if code:
        raise typer.Exit(code)
