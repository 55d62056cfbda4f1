"""`ddtree-deploy bench HOST [DEPLOYMENT]`, `bench report`, `bench recommend` (thin)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from ddtree_deploy.cli.common import (
    MAX_WAIT_S,
    config_of,
    confirm,
    console,
    is_tty,
    print_results,
    rich_console,
)
from ddtree_deploy.errors import ExitCode, RefusedError, UsageError


class _BenchGroup(TyperGroup):
    """`bench HOST ...` runs a sweep (`bench run HOST ...`); `bench report|recommend` as named.
    A first word that looks like a mistyped subcommand (`bench reprot`) is a usage error that
    names the command, not a sweep of a host of that name (`bench run NAME` still is one)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and self.get_command(ctx, args[0]) is None and not args[0].startswith("-"):
            import difflib

            close = difflib.get_close_matches(args[0], self.list_commands(ctx), n=1, cutoff=0.7)
            if close:
                ctx.fail(f"No such command {args[0]!r}. Did you mean {close[0]!r}? (to bench a "
                         f"host named {args[0]!r}: bench run {args[0]})")
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(cls=_BenchGroup, no_args_is_help=True,
                  help="Sweep DFlash / DDTree settings on a deployed service, chart and choose: "
                       "`bench HOST [DEPLOYMENT]`, `bench report`, `bench recommend`.")
out = console(soft_wrap=True)
err = console(stderr=True, soft_wrap=True)
DEFAULT_CONFIGS = "none,dflash,ddtree:15/8,ddtree:31/8"
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM (the service put back first)


def _facts(config: Any, spec: Any, venvs: list[str]) -> Any:
    from ddtree_deploy.facts.cache import FactsCache
    from ddtree_deploy.facts.gather import collect

    (outcome,) = collect(config, [spec.name], cache=FactsCache(), refresh=True,
                         extra_venvs={spec.name: venvs})
    if outcome.value is None:
        assert outcome.error is not None
        raise outcome.error
    return outcome.value


def _file_name(value: str | None, flag: str) -> Path | None:
    """A file named on the command line; an empty name is a usage error, not the folder '.'."""
    if value is None:
        return None
    if not value.strip():
        raise UsageError(f"{flag} {value!r}: expected a file name")
    return Path(value).expanduser()


def _say(text: str) -> None:
    from ddtree_deploy.cli.text import plain

    err.print(plain(text), markup=False, highlight=False)


@app.command("run")
def run(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="a host of the hosts file (localhost: this machine)"),
    deployment: str = typer.Argument(None, help="the deployment to bench (default: the host's "
                                                "only one)"),
    grid_name: str = typer.Option(None, "--grid", metavar="FILE",
                                   help="a YAML grid (benchmarks/grids/*.yaml); overrides the "
                                        "grid flags below"),
    configs: str = typer.Option(DEFAULT_CONFIGS, "--configs",
                                help="none, dflash, ddtree:BUDGET/TOPK, shadow:BUDGET/TOPK"),
    concurrency: str = typer.Option("1,4,16", "--concurrency",
                                    help="requests in flight per cell, comma-separated"),
    sampling: str = typer.Option("greedy,sampled", "--sampling",
                                 help="greedy, sampled or both, comma-separated"),
    workload_names: str = typer.Option("code,math,json,chat,agentic", "--workloads",
                                       help="workloads of bench/workloads.json, "
                                            "comma-separated"),
    requests: int = typer.Option(16, "--requests", min=1, max=10000,
                                 help="requests per cell (agentic: sessions)"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", min=1, max=32768,
                                       help="tokens each request may generate"),
    repeats: int = typer.Option(1, "--repeats", min=1, max=100,
                                help="times each cell is measured"),
    time_limit: float = typer.Option(120.0, "--time-limit", min=1, max=86400,
                                     help="seconds per cell: no new request after it"),
    warmup_requests: int = typer.Option(2, "--warmup-requests", min=0, max=100,
                                        help="requests sent and not measured before each "
                                             "configuration"),
    prompts: str = typer.Option("auto", "--prompts", help="ids | text | auto"),
    mode: str = typer.Option("auto", "--mode",
                             help="auto | systemd | plain (a plain process with a log file, "
                                  "for hosts without systemd; this machine only)"),
    results_name: str = typer.Option(None, "--results", metavar="FILE",
                                     help="results JSON (default: the XDG state folder)"),
    label: str = typer.Option(None, "--label", help="a note kept with the results, e.g. "
                                                    "'synthetic: dummy weights'"),
    deadline: float = typer.Option(900.0, "--deadline", min=1, max=MAX_WAIT_S,
                                   help="seconds for each start's probe"),
    warmup: float = typer.Option(600.0, "--warmup", min=1, max=MAX_WAIT_S,
                                 help="seconds the probe's first tokens may take (JIT compiles)"),
    force: bool = typer.Option(False, "--force", help="use a GPU other processes hold or a "
                                                      "taken port anyway (as service up)"),
    mixed_stack: bool = typer.Option(False, "--mixed-stack",
                                     help="resume a results file measured on another stack "
                                          "(payload, sglang, torch, driver, GPU) anyway"),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show what would run, run nothing"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Sweep the grid on HOST's service: restart per configuration, measure, put it back."""
    from ddtree_deploy.bench import grid as gridmod
    from ddtree_deploy.bench import workloads
    from ddtree_deploy.bench.prepare import host_facts, pick_deployment, prepare
    from ddtree_deploy.bench.results import Results, results_dir
    from ddtree_deploy.bench.server import PlainControl, SystemdControl
    from ddtree_deploy.bench.sweep import SweepInterrupted, make_plan, run_sweep
    from ddtree_deploy.converge.lock import HostLock
    from ddtree_deploy.transport import Command
    from ddtree_deploy.transport.connect import open_transport

    grid_file = _file_name(grid_name, "--grid")
    results_file = _file_name(results_name, "--results")
    if results_file is not None and results_file.suffix.lower() == ".csv":
        # save() writes the JSON, then its CSV at path.with_suffix(".csv"): the same file
        raise UsageError(f"--results {results_name!r}: the results are JSON and their CSV is "
                         "written beside them with the suffix .csv, over this very file; "
                         "name the JSON file (results.json)")
    if mode not in ("auto", "systemd", "plain"):
        raise UsageError(f"--mode must be auto, systemd or plain, got {mode!r}")
    if prompts not in ("ids", "text", "auto"):
        raise UsageError(f"--prompts must be ids, text or auto, got {prompts!r}")
    known = workloads.names()
    if grid_file is not None:
        grid = gridmod.load(grid_file, known)
    else:
        grid = gridmod.from_flags(configs, concurrency, sampling, workload_names, known,
                                  requests=requests, max_new_tokens=max_new_tokens,
                                  repeats=repeats, time_limit_s=time_limit,
                                  warmup_requests=warmup_requests, prompts=prompts)
    config = config_of(ctx)
    spec_host = config.host(host)
    dep = pick_deployment(config, spec_host, deployment)
    venvs = [str(spec_host.venvs[dep.venv].path)] if dep else []
    with open_transport(config, spec_host) as t:
        facts = _facts(config, spec_host, venvs)
        prepared = prepare(t, config, spec_host, facts, dep, grid, force=force)
        base = prepared.base
        if mode == "auto":
            has_systemd = t.run(Command.of("test", "-d", "/run/systemd/system"), timeout=30).ok
            mode = "systemd" if has_systemd else "plain"
        path = results_file or results_dir(spec_host.name, base.name) / "results.json"
        results = Results.open(path, host=spec_host.name, service=base.name)
        now = host_facts(facts, base)
        changed = results.stack_change(now)
        if changed and not mixed_stack:
            was = results.data.get("host_facts") or {}
            diff = "; ".join(f"{k} {was.get(k)!r} then, {now.get(k)!r} now" for k in changed)
            raise UsageError(f"{path}: its {len(results.cells)} cells were measured on another "
                             f"stack ({diff}): resuming would compare the two in one report",
                             hint="pass another --results file, or --mixed-stack to resume "
                                  "anyway (each configuration records the stack it ran on)")
        results.record_facts(now)
        results.data["grid"] = {"source": grid.source, "requests": grid.requests,
                                "max_new_tokens": grid.max_new_tokens,
                                "time_limit_s": grid.time_limit_s, "prompts": "ids"
                                if prepared.ids else "text", "drafter_block": prepared.block}
        if label:
            results.data["label"] = label
            results.data["synthetic"] = "synthetic" in label.lower()
        plan = make_plan(grid, prepared.specs, results, ids=prepared.ids, vocab=prepared.vocab)
        restarts = plan.configs_to_run()
        summary: dict[str, Any] = {"host": spec_host.name, "service": base.name, "mode": mode,
                                   "results": str(path), "csv": str(path.with_suffix(".csv")),
                                   "to_measure": len(plan.todo), "already": plan.skipped,
                                   "configs": [c.key for c in restarts],
                                   "flags": {k: s.server_args() for k, s in plan.specs.items()}}
        if not plan.todo:
            _say(f"all {plan.skipped} cells of the grid are measured in {path}; nothing to run")
            if as_json:
                print_results(out, {**summary, "measured": 0})
            return
        what = "a plain process" if mode == "plain" else f"{base.unit_name}"
        _say(f"bench will restart {what} on {spec_host.name} {len(restarts)} time(s) "
             f"({', '.join(c.label for c in restarts)}) and measure {len(plan.todo)} cells "
             f"({plan.skipped} already measured); the service is put back as it was at the end")
        if dry_run:
            if as_json:
                print_results(out, {**summary, "dry_run": True})
            return
        if not yes:
            if not sys.stdin.isatty():
                raise UsageError("bench restarts the service: confirm on a terminal, or pass "
                                 "--yes")
            if not confirm("Run the sweep?", err=as_json):
                if as_json:  # the one document says so
                    raise RefusedError("the sweep was not confirmed: nothing was run")
                raise typer.Exit(int(ExitCode.FAILED))
        if dep is not None and base.secrets:  # the key and token files the unit reads
            from ddtree_deploy.service import endpoint

            endpoint.install_secrets(t, base.name, endpoint.read_secrets(
                dep.api_key_file, dep.hf_token_file, dep.name), base.user)
        control = (PlainControl(t, path.parent / f"{path.stem}-logs") if mode == "plain"
                   else SystemdControl(t, base.unit_name))
        try:
            with open_transport(config, spec_host) as lock_t, \
                    HostLock(lock_t, spec_host) as lock:
                swept = _with_progress(lambda hooks: run_sweep(
                    t, control, plan, results, deadline_s=deadline, warmup_s=warmup,
                    hooks=hooks), len(plan.todo), lock.check, as_json)
        except SweepInterrupted as stop:
            summary.update(stop.summary)
            _say(f"interrupted: {summary['measured']} cells measured, kept in {path}; a re-run "
                 "measures the rest")
            if as_json:
                print_results(out, summary, EXIT_INTERRUPTED)
            raise typer.Exit(EXIT_INTERRUPTED) from None
    summary.update(swept)
    code = int(ExitCode.FAILED) if swept["unhealthy"] else 0
    if as_json:
        print_results(out, summary, code)
        return
    _say(f"measured {swept['measured']} cells; results: {path} (+ .csv)")
    if code:
        raise typer.Exit(code)


def _with_progress(body: Any, total: int, check_lock: Any, as_json: bool) -> dict[str, Any]:
    from ddtree_deploy.bench.sweep import Hooks

    if not is_tty(err):
        hooks = Hooks(say=_say, check_lock=check_lock,
                      cell_done=lambda c, m: _say(f"  {c.label}: {m['output_tok_s']} tok/s, "
                                                  f"accept {m['accept_length']}, "
                                                  f"failed {m['failed']}"))
        result: dict[str, Any] = body(hooks)
        return result
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=rich_console(err), transient=False) as bar:
        task = bar.add_task("cells", total=total)

        def done(cell: Any, m: dict[str, Any]) -> None:
            bar.update(task, advance=1, description=cell.label)
            bar.console.print(f"  {cell.label}: {m['output_tok_s']} tok/s, accept "
                              f"{m['accept_length']}, failed {m['failed']}", markup=False,
                              highlight=False)

        result = body(Hooks(say=lambda m: bar.console.print(m, markup=False, highlight=False),
                            cell_done=done, check_lock=check_lock))
        return result


def _results_path(ctx: typer.Context, results_file: Path | None, host: str | None,
                  deployment: str | None) -> Path:
    from ddtree_deploy.bench.results import results_dir

    if results_file is not None:
        return results_file
    if host is None:
        raise UsageError("give --results FILE, or HOST [DEPLOYMENT] to find the results in the "
                         "XDG state folder")
    from ddtree_deploy.bench.prepare import pick_deployment

    config = config_of(ctx)
    spec_host = config.host(host)
    dep = pick_deployment(config, spec_host, deployment)
    service = dep.service_name if dep else "sglang"
    return results_dir(spec_host.name, service) / "results.json"


@app.command("report")
def report(
    ctx: typer.Context,
    host: str = typer.Argument(None, help="with DEPLOYMENT: where bench stored its results"),
    deployment: str = typer.Argument(None, help="the deployment benched (default: the host's "
                                                "only one)"),
    results_name: str = typer.Option(None, "--results", metavar="FILE",
                                     help="a results JSON (default: HOST's in the XDG state "
                                          "folder)"),
    out_dir: str = typer.Option(None, "--out", metavar="DIR",
                                help="default: a report/ folder beside the results (made if "
                                     "missing)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Markdown, HTML and LaTeX report with charts (each PNG with its CSV) from bench results."""
    from ddtree_deploy.bench.report import build_report, out_folder
    from ddtree_deploy.bench.results import Results

    path = _results_path(ctx, _file_name(results_name, "--results"), host, deployment)
    folder = out_folder(out_dir, path.parent / "report")
    results = Results.load(path)
    made = build_report(results, folder)
    if as_json:
        print_results(out, made.to_json())
        return
    _say(f"report: {made.out_dir / 'report.md'} and report.html ({len(made.files)} files)")
    overall = made.recommendation.get("overall")
    if overall:
        _say(f"best overall: {overall['name']} ({overall['margin_over_dflash'] * 100:+.1f}% over "
             f"DFlash, spread {overall['spread'] * 100:.1f}%)")


@app.command("recommend")
def recommend_cmd(
    ctx: typer.Context,
    host: str = typer.Argument(None, help="with DEPLOYMENT: where bench stored its results"),
    deployment: str = typer.Argument(None, help="the deployment benched (default: the host's "
                                                "only one)"),
    results_name: str = typer.Option(None, "--results", metavar="FILE",
                                     help="a results JSON (default: HOST's in the XDG state "
                                          "folder)"),
    write: str = typer.Option(None, "--write", metavar="DEPLOYMENT",
                              help="write the overall choice into this deployment of the hosts "
                                   "file (a diff is shown first)"),
    workload: str = typer.Option(None, "--workload",
                                 help="write the choice for this workload instead of overall"),
    yes: bool = typer.Option(False, "--yes", "-y", help="write without asking"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The best configuration per workload and overall, its margin over DFlash and spread."""
    from ddtree_deploy.bench import hostsedit
    from ddtree_deploy.bench.recommend import NoDflash, recommend
    from ddtree_deploy.bench.results import Results
    from ddtree_deploy.bench.summary import fold

    path = _results_path(ctx, _file_name(results_name, "--results"), host, deployment)
    try:
        rec = recommend(fold(Results.load(path)))
    except NoDflash as exc:
        raise UsageError(f"{path}: {exc}", hint="the grid needs a dflash configuration") from None
    choice = rec["workloads"].get(workload) if workload else rec["overall"]
    if workload and workload not in rec["workloads"]:
        raise UsageError(f"no recommendation for workload {workload!r}; have: "
                         f"{', '.join(rec['workloads']) or 'none'}")
    data: dict[str, Any] = {"results": str(path),
                            "overall": rec["overall"].to_json() if rec["overall"] else None,
                            "workloads": {w: c.to_json() for w, c in rec["workloads"].items()}}
    if not as_json:
        for scope, c in [("overall", rec["overall"]), *rec["workloads"].items()]:
            if c is None:
                _say(f"{scope}: no configuration measured in every cell without failures")
                continue
            noise = "  (within the spread)" if c.within_noise else ""
            _say(f"{scope:>10}: {c.name:<16} {c.margin * 100:+6.1f}% over DFlash, spread "
                 f"{c.spread * 100:4.1f}% over {c.cells} cells{noise}")
    if write:
        if choice is None:
            raise UsageError("nothing to write: no configuration was measured in every cell")
        config = config_of(ctx)
        old, new = hostsedit.new_text(config.path, write, choice)
        patch = hostsedit.diff(config.path, old, new)
        data["write"] = {"deployment": write, "file": str(config.path), "diff": patch,
                         "written": False}
        if not patch:
            _say(f"{config.path}: deployment {write} already has this configuration")
        else:
            if not as_json:
                sys.stderr.write(patch)
            if not yes:
                if not sys.stdin.isatty():
                    raise UsageError("recommend --write edits the hosts file: confirm on a "
                                     "terminal, or pass --yes")
                if not confirm(f"Write this into {config.path}?", err=as_json):
                    if as_json:  # the one document says so
                        raise RefusedError(f"{config.path}: the write was not confirmed: "
                                           "nothing was written")
                    raise typer.Exit(int(ExitCode.FAILED))
            hostsedit.write(config.path, new)
            data["write"]["written"] = True
            _say(f"{config.path}: deployment {write} now uses {choice.name}; "
                 f"`ddtree-deploy plan` shows the restart it needs")
    if as_json:
        print_results(out, data)
