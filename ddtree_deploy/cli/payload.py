"""`ddtree-deploy payload deploy | verify | rollback | status` (thin: parse, call, render)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer

from ddtree_deploy.cli.common import WIDE_HELP, config_of, console, host_path, print_results
from ddtree_deploy.cli.text import esc, plain
from ddtree_deploy.config.roles import refuse_write

app = typer.Typer(help="The DDTree runtime as a payload on a venv's SGLang.", no_args_is_help=True)
out = console(soft_wrap=True)

VENV = typer.Option(..., "--venv", help="the venv on the host (a path)")
PAYLOAD = typer.Option(None, "--payload", help="a payload folder (default: the built-in one)")
INSTALLER = typer.Option("auto", "--installer",
                         help="the plugin form's installer: uv (pushed where the host has none), "
                              "the venv's own pip (--no-index --no-deps), or auto (uv, else pip)")


def _manifest(folder: Path | None):
    from ddtree_deploy.payload.manifest import load_manifest
    from ddtree_deploy.resources import data_path

    root = folder if folder is not None else data_path("payload")
    manifest, _ = load_manifest(root)
    return manifest, root


def _find_uv(t) -> str:
    """uv on the host for the plugin form: the host's own, else the pinned one pushed."""
    from ddtree_deploy.converge.steps._install_uv import ensure_uv

    return ensure_uv(t, sudo=False)


def _render(outcome, as_json: bool) -> None:
    """Say the outcome, and exit 1 when one of its checks failed."""
    failed = int(any(c.status == "failed" for c in outcome.checks))
    if as_json:
        print_results(out, asdict(outcome), failed)
        return
    was = f", was {outcome.previous}" if outcome.previous else ""
    what = "plugin" if outcome.form == "plugin" else "payload"
    out.print(plain(f"{outcome.venv}: {outcome.action} (sglang {outcome.sglang or '?'}, "
                    f"{what} {outcome.payload or '-'}{was})"), markup=False, highlight=False)
    for note in outcome.notes:
        out.print(plain(f"  note: {note}"), markup=False, highlight=False)
    for c in outcome.checks:
        style = {"passed": "green", "failed": "red", "skipped": "yellow"}[c.status]
        out.print(f"  [{style}]{c.status}[/{style}] {esc(c.name)} ({esc(c.mode)}): "
                  f"{esc(c.detail)}", highlight=False)
    if failed:
        raise typer.Exit(1)


@app.command("deploy")
def deploy(ctx: typer.Context, host: str = typer.Argument(...), venv: str = VENV,
           payload: Path = PAYLOAD, installer: str = INSTALLER,
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Install the payload in the form the venv's sglang takes: the patch set on 0.5.11 (refused
    unless its upstream files match), the plugin wheel on 0.5.17+; other versions refused."""
    from ddtree_deploy.facts.cache import FactsCache
    from ddtree_deploy.payload import deploy as ops
    from ddtree_deploy.transport.connect import open_transport

    host_path(venv, "--venv")
    config = config_of(ctx)
    spec = config.host(host)
    refuse_write(spec, venv, "payload deploy")
    if installer not in ("auto", "uv", "pip"):
        from ddtree_deploy.errors import UsageError

        raise UsageError(f"--installer: expected auto, uv or pip, got {installer!r}")
    manifest, folder = _manifest(payload)
    with open_transport(config, spec) as t:
        outcome = ops.deploy(t, venv, manifest, folder, installer,  # type: ignore[arg-type]
                             find_uv=_find_uv)
    FactsCache().drop(spec)
    _render(outcome, as_json)


@app.command("verify")
def verify(ctx: typer.Context, host: str = typer.Argument(...), venv: str = VENV,
           payload: Path = PAYLOAD, as_json: bool = typer.Option(False, "--json")) -> None:
    """Run the payload's checks in the venv's own python (says what it had to skip)."""
    from ddtree_deploy.payload import deploy as ops
    from ddtree_deploy.transport.connect import open_transport

    host_path(venv, "--venv")
    config = config_of(ctx)
    manifest, _ = _manifest(payload)
    with open_transport(config, config.host(host)) as t:
        found, state = ops.installed(t, venv)
        if state is None:
            if as_json:
                print_results(out, {"venv": venv, "action": "no payload deployed"}, 1)
            out.print(f"{venv}: no payload deployed", markup=False, highlight=False)
            raise typer.Exit(1)
        checks = ops.verify(t, venv, manifest, state.package_dir, torch=found["torch"],
                            state=state)
    outcome = ops.Outcome(venv, "verified", found["version"], state.version, checks,
                          form=state.form)
    _render(outcome, as_json)


@app.command("rollback")
def rollback(ctx: typer.Context, host: str = typer.Argument(...), venv: str = VENV,
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Restore the upstream files byte for byte and remove what the payload added."""
    from ddtree_deploy.facts.cache import FactsCache
    from ddtree_deploy.payload import deploy as ops
    from ddtree_deploy.transport.connect import open_transport

    host_path(venv, "--venv")
    config = config_of(ctx)
    spec = config.host(host)
    refuse_write(spec, venv, "payload rollback")
    with open_transport(config, spec) as t:
        outcome = ops.rollback(t, venv, find_uv=_find_uv)
    FactsCache().drop(spec)
    _render(outcome, as_json)


@app.command("status")
def status(ctx: typer.Context, host: str = typer.Argument(...),
           as_json: bool = typer.Option(False, "--json"),
           wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)) -> None:
    """Which payload version is on each venv of the host (declared and discovered)."""
    from ddtree_deploy.cli.render_table import add_row, make_table, show
    from ddtree_deploy.cli.text import cell
    from ddtree_deploy.facts.cache import FactsCache
    from ddtree_deploy.facts.gather import collect
    from ddtree_deploy.payload import deploy as ops
    from ddtree_deploy.transport.connect import open_transport

    config = config_of(ctx)
    spec = config.host(host)
    (facts,) = collect(config, [spec.name], cache=FactsCache())
    venvs = [str(v.path) for v in spec.venvs.values()]
    if facts.value is not None:
        venvs += [v.path for v in facts.value.venvs if v.exists and v.sglang is not None]
    venvs = list(dict.fromkeys(venvs))
    with open_transport(config, spec) as t:
        states = ops.status(t, venvs)
    failed = any(st is not None and "error" in st for st in states.values())
    if as_json:
        from ddtree_deploy.isotime import utc_iso

        print_results(out, {venv: st if st is None or "deployed_at" not in st else  # 0: unknown
                            {**st, "deployed_at": utc_iso(st["deployed_at"] or None)}
                            for venv, st in states.items()}, int(failed))
        return
    table = make_table(f"payloads on {host}", ("venv", "payload", "sglang", "deployed"))
    for venv, st in states.items():
        if st is None:
            add_row(table, venv, "-", "", "")
        elif "error" in st:
            add_row(table, venv, cell(st["error"], "red"), "", "")
        else:
            add_row(table, venv, f"{st['payload']} {st['version']} ({st.get('form', 'patch')})",
                    st.get("sglang", "?"), st.get("backup") or "(plugin: no backup)")
    show(out, table, wide=wide)
    if failed:  # a venv that is not one, or whose state cannot be read, is not a status
        raise typer.Exit(1)
