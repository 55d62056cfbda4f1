"""`ddtree-deploy overlay --abi LANE ...`, `overlay rollback`, `overlay history` (thin)."""

from __future__ import annotations

import json
from typing import Any

import typer

from ddtree_deploy.cli.common import config_of, console, host_path, print_results, rich_console
from ddtree_deploy.cli.text import plain
from ddtree_deploy.config.hosts import Config
from ddtree_deploy.config.roles import refuse_write
from ddtree_deploy.errors import ExitCode, UsageError

app = typer.Typer(help="Move a CUDA lane (torch, triton, nvidia libraries, sgl_kernel) between "
                       "hosts through the workstation: exact, cached, reversible.",
                  invoke_without_command=True, no_args_is_help=True)
out = console(soft_wrap=True)
err = console(stderr=True, soft_wrap=True)
COMPRESS = ("auto", "always", "never")  # overlay/relay.py's choices for the streams
_TIMES = frozenset({"time", "created", "started"})  # the fields of history entries that are times


_host_path = host_path  # a venv on a host: its absolute path (cli.common)


def check_sentence(check: Any) -> str:
    """One of the lane's checks, as a sentence: `check torch_cuda passed: torch.version.cuda
    is '13.0', expected '13.0'`."""
    if not isinstance(check, dict):
        return plain(f"check {check}")
    ok = check.get("ok")
    verdict = "passed" if ok is True else "FAILED" if ok is False else "was not run"
    detail = check.get("detail")
    return plain(f"check {check.get('check', '?')} {verdict}" + (f": {detail}" if detail else ""))


def _target(config: Config, lane_name: str, host: str | None, venv: str | None
            ) -> tuple[str, str]:
    """--to/--venv, else the one deployment of the hosts file that needs this lane."""
    if host:
        config.host(host)  # a host of the file (a typo named as such)
    if host and venv:
        return host, venv
    deps = [d for d in config.deployments.values() if d.cuda_lane == lane_name
            and (host is None or d.host == host)]
    if len(deps) != 1:
        raise UsageError(f"say where the {lane_name} lane goes: --to HOST --venv PATH "
                         f"({len(deps)} deployments of the hosts file need it)")
    dep = deps[0]
    return dep.host, venv or str(config.host(dep.host).venvs[dep.venv].path)


@app.callback()
def overlay(
    ctx: typer.Context,
    abi: str = typer.Option(None, "--abi", help="the lane: cu130, cu128 (overlays/*.yaml)"),
    to: list[str] = typer.Option(None, "--to", help="target HOST, or HOST:VENV; repeat it for "
                                 "several targets, served in parallel (default: the "
                                 "deployment's)"),
    venv: str = typer.Option(None, "--venv", help="target venv (default: the deployment's)"),
    from_host: str = typer.Option(None, "--from", help="source host (default: the lane's)"),
    from_venv: str = typer.Option(None, "--from-venv", help="source venv (default: the lane's)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show what would change, send nothing"),
    compress: str = typer.Option("auto", "--compress", metavar="auto|always|never",
                                 help="zstd on the streams: chosen by measurement (auto), "
                                      "always, or never"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Overlay the lane --abi onto a venv (or run a subcommand: rollback, history)."""
    if ctx.invoked_subcommand is not None:
        return
    if abi is None:
        raise UsageError("--abi LANE is needed (e.g. --abi cu130)")
    _host_path(venv, "--venv")
    _host_path(from_venv, "--from-venv")
    if compress not in COMPRESS:
        raise UsageError(f"--compress {compress!r}: expected one of {', '.join(COMPRESS)}")
    from ddtree_deploy.overlay.blobcache import BlobCache
    from ddtree_deploy.overlay.lanefile import load_lane
    from ddtree_deploy.overlay.progress import RichProgress
    from ddtree_deploy.overlay.run import make_plan, run_fleet
    from ddtree_deploy.overlay.summary import fleet_summary, parse_targets

    config = config_of(ctx)
    lane = load_lane(abi).with_source(host=from_host, venv=from_venv)
    wanted = parse_targets(to or [], venv) or [("", None)]
    targets = [_target(config, lane.lane, h or None, _host_path(v, "--to HOST:VENV"))
               for h, v in wanted]
    if from_host is None and lane.source.host not in config.hosts:
        raise UsageError(f"the {lane.lane} lane's source host {lane.source.host!r} (its default, "
                         f"in overlays/{lane.lane}.yaml) is not in {config.path}",
                         hint="name the source venv: --from HOST --from-venv PATH")
    config.host(lane.source.host)
    if not dry_run:
        for h, v in targets:
            refuse_write(config.host(h), v, f"overlay --abi {lane.lane}")
    cache = BlobCache(read_only=dry_run)  # a dry run makes and sweeps nothing
    if dry_run:
        from ddtree_deploy.overlay.render import render_plan  # rich: only to draw the plan

        plans = [make_plan(config, lane, h, v, cache)[0] for h, v in targets]
        if as_json:  # one target: its plan; several: a list of plans
            dumped = [p.model_dump(mode="json") for p in plans]
            print_results(out, dumped[0] if len(dumped) == 1 else dumped)
        else:
            for plan in plans:
                render_plan(plan, rich_console(out))
        return
    with RichProgress(lambda: rich_console(err)) as progress:  # rich only once bytes move
        fleet = run_fleet(config, lane, targets, cache=cache, progress=progress,
                          on_status=lambda s: None, compress=compress, densify=True)
    changed = [r for r in fleet.targets if r.result != "unchanged"]
    if changed:  # an unchanged venv keeps its facts (and the run never loads the facts model)
        from ddtree_deploy.facts.cache import FactsCache

        for r in changed:
            FactsCache().drop(config.host(r.host))
    if len(targets) == 1 and fleet.failed:
        raise fleet.failed[0].error  # type: ignore[misc]  # one target: its error, as ever
    summary: dict[str, Any] = fleet_summary(fleet, lane.lane)
    code = (0 if not fleet.failed else  # some targets failed: 3; every one: 1
            int(ExitCode.PARTIAL if len(fleet.failed) < len(targets) else ExitCode.FAILED))
    if as_json:
        print_results(out, summary, code)
    else:
        for t in summary.get("targets", [summary]):
            where = f"{t['target']['host']}:{t['target']['venv']}"
            out.print(plain(f"{where}: lane {lane.lane} {t['result']} (fetched "
                            f"{summary['bytes_fetched']} B, pushed {t['bytes_pushed']} B)"
                            + (f": {t['error']}" if t.get("error") else "")),
                      markup=False, highlight=False)
            for c in t["checks"]:
                out.print(f"  {check_sentence(c)}", markup=False, highlight=False)
    if code:
        raise typer.Exit(code)


@app.command("rollback")
def rollback(ctx: typer.Context, host: str = typer.Argument(...),
             venv: str = typer.Option(..., "--venv",
                                      help="the venv (a path on the host) to put back"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Undo the latest overlay of the venv, byte for byte, from its backup."""
    from ddtree_deploy.facts.cache import FactsCache
    from ddtree_deploy.overlay import apply as remote_apply
    from ddtree_deploy.transport.connect import open_transport

    _host_path(venv, "--venv")
    config = config_of(ctx)
    spec = config.host(host)
    refuse_write(spec, venv, "overlay rollback")
    with open_transport(config, spec) as t:
        outcome = remote_apply.rollback(t, venv, sudo=spec.use_sudo)
    FactsCache().drop(spec)
    if as_json:
        print_results(out, {"host": host, "venv": venv, "result": outcome.result,
                            "message": outcome.message})
        return
    out.print(plain(f"{host}:{venv}: {outcome.result}: {outcome.message}"), markup=False,
              highlight=False)


@app.command("history")
def history(ctx: typer.Context, host: str = typer.Argument(...),
            venv: str = typer.Option(None, "--venv", help="default: every venv of the host"),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """Every overlay applied to (and rolled back from) the host's venvs."""
    from ddtree_deploy.overlay import apply as remote_apply
    from ddtree_deploy.transport.connect import open_transport

    _host_path(venv, "--venv")
    config = config_of(ctx)
    spec = config.host(host)
    venvs = [venv] if venv else [str(v.path) for v in spec.venvs.values()]
    rows: dict[str, list[dict[str, Any]]] = {}
    notes: dict[str, str | None] = {}
    with open_transport(config, spec) as t:  # a read: nothing is written on the host
        for v in venvs:
            rows[v], notes[v] = remote_apply.history(t, v, sudo=spec.use_sudo)
    if as_json:  # the host's times (its own zone) in UTC
        from ddtree_deploy.isotime import utc_iso

        print_results(out, {v: [{k: utc_iso(x) if k in _TIMES else x for k, x in e.items()}
                                for e in entries] for v, entries in rows.items()})
        return
    for v, entries in rows.items():
        note = f" ({notes[v]})" if notes[v] else ""
        out.print(plain(f"{host}:{v}: {len(entries)} entries{note}"), markup=False,
                  highlight=False)
        for e in entries:
            out.print(plain(f"  {json.dumps(e, sort_keys=True)}"), highlight=False, markup=False)
