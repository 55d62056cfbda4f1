"""`ddtree-deploy plan HOST...` and `ddtree-deploy apply HOST...` (thin: parse, call, render)."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ddtree_deploy.cli.common import (
    MAX_WAIT_S,
    config_of,
    confirm,
    console,
    host_failure,
    hosts_or_all,
    is_tty,
    print_results,
    rich_console,
)
from ddtree_deploy.cli.files import output_path, read_input, write_output
from ddtree_deploy.cli.text import esc, plain
from ddtree_deploy.config.hosts import EMBEDDED, Config
from ddtree_deploy.errors import DeployError, ExitCode, RefusedError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

out = console(soft_wrap=True)
err = console(stderr=True, soft_wrap=True)
MARK = {True: "[green]=[/green]", False: "[yellow]+[/yellow]"}


def _render(plan_: object, out: Console = out) -> None:
    from ddtree_deploy.converge.steps import Plan

    assert isinstance(plan_, Plan)
    current = None
    for s in plan_.steps:
        if (s.host, s.deployment) != current:
            current = (s.host, s.deployment)
            out.print(f"\n[bold]{esc(s.host)} / {esc(s.deployment)}[/bold]")
        if s.kind == "service.probe":
            out.print(f"  [cyan]?[/cyan] {esc(s.kind):<16} {esc(s.title)}: {esc(s.reason)}",
                      highlight=False)
            continue
        out.print(f"  {MARK[not s.pending]} {esc(s.kind):<16} {esc(s.title)}: {esc(s.reason)}",
                  highlight=False)
        for change in s.changes:
            if change.startswith(("unit -", "unit +")):  # the unit's diff, old then new
                style = "red" if change[5] == "-" else "green"
                out.print(f"         [{style}]{esc(change[5:])}[/{style}]", highlight=False)
            else:
                out.print(f"      -> {esc(change)}", highlight=False)
    n = len(plan_.changes)
    planned = [h for h in plan_.hosts if h not in plan_.errors]
    if planned:
        out.print(f"\nPlan: {n} to change, {len(plan_.steps) - n} satisfied or checks."
                  if n else "\nNo changes: every deployment is as hosts.yaml says.")
    _facts_age(plan_, out)
    for host, failure in plan_.errors.items():  # whole, under the plan: never hidden
        out.print(f"[red]{esc(host)}: not planned[/red]: {esc(failure.get('error'))}",
                  highlight=False)


AGE_SHOWN_S = 5.0  # facts older than this are said to be so


def _facts_age(plan_: object, out: Console = out) -> None:
    """Say how old each host's facts are when they came from the cache."""
    from ddtree_deploy.converge.steps import Plan

    assert isinstance(plan_, Plan)
    for host, taken in sorted(plan_.facts_at.items()):
        age = (plan_.made_at or time.time()) - taken
        if taken and age >= AGE_SHOWN_S:
            out.print(plain(f"{host}: planned on facts taken {age:.0f} s ago (from the cache; "
                            "--refresh gathers them anew)"), markup=False, highlight=False)


def plan(
    ctx: typer.Context,
    hosts: list[str] = typer.Argument(None, help="hosts (default: every host with deployments)"),
    as_json: bool = typer.Option(False, "--json"),
    out_file: str = typer.Option(None, "--out", help="save the plan for `apply --plan FILE`"),
    refresh: bool = typer.Option(False, "--refresh", help="gather facts even if fresh ones exist"),
) -> None:
    """What apply would do to reach the deployments of hosts.yaml (exit 4: changes pending)."""
    from ddtree_deploy.converge.runner import make_plan

    out_path = output_path(out_file, "--out") if out_file is not None else None
    config = config_of(ctx)
    if out_path is not None and out_path.exists() and out_path.samefile(config.path):
        raise UsageError(f"--out {out_file}: is the hosts file itself; the plan would replace "
                         "it (name another file, plan.json)")
    names = hosts_or_all(config, hosts) if hosts else sorted(
        {d.host for d in config.deployments.values()})
    p = make_plan(config, names, refresh=refresh)
    if len(p.hosts) == 1 and p.failures:  # one host, and it failed: its error, as ever
        raise next(iter(p.failures.values()))
    if out_path is not None:
        write_output(out_path, json.dumps(p.as_json(), indent=1), "--out")
    code = p.exit_code()  # 3 (some hosts not planned) wins over 4 (changes pending)
    if as_json:
        print_results(out, p.as_json(), code)
        return
    _render(p)
    if code:
        raise typer.Exit(code)



def _secrets(config: Config, host: str) -> frozenset[str]:
    from ddtree_deploy.converge.runner import secret_values

    try:
        return secret_values(config, config.host(host))
    except DeployError:  # not a host of the file: nothing of it to mask
        return frozenset()


def _masked(config: Config, host: str, error: object) -> str:
    """An error's text with the host's deployment secrets as *** (host text in a message
    may carry them)."""
    from ddtree_deploy.transport.command import mask_secrets

    return mask_secrets(str(error), _secrets(config, host))


def _failed(config: Config, host: str, error: Exception) -> dict[str, Any]:
    """A failed host in apply's --json results, its message and hint masked as _masked."""
    from ddtree_deploy.transport.command import mask_secrets

    doc = host_failure(host, error)
    secrets = _secrets(config, host)
    doc["error"] = {k: mask_secrets(v, secrets) if isinstance(v, str) else v
                    for k, v in doc["error"].items()}
    return doc


def can_ask() -> bool:
    """Whether apply can ask its question (stdin is a terminal)."""
    return sys.stdin.isatty()


def _check_version(saved: object, plan_file: Path) -> None:
    """A saved plan runs only with the tool version that made it."""
    from ddtree_deploy import __version__
    from ddtree_deploy.converge.steps import Plan

    assert isinstance(saved, Plan)
    if saved.tool_version != __version__ or not saved.specs:
        made = saved.tool_version or "a version that did not record itself"
        raise RefusedError(f"{plan_file}: made by ddtree-deploy {made}, this is {__version__}",
                           hint="make a new plan with this version: "
                                + _replan(saved.hosts, plan_file))


def _replan(hosts: list[str], plan_file: Path) -> str:
    """The command that makes the saved plan anew (a command line the CLI accepts)."""
    from ddtree_deploy.rules.findings import command

    return command("plan", *hosts, "--out", str(plan_file))


def _check_specs(saved: object, config: Config, host: str, plan_file: Path) -> None:
    """The host's deployments in the hosts file must be those the saved plan was made from."""
    from ddtree_deploy.converge.steps import HOST_KEY, Plan, spec_digests

    assert isinstance(saved, Plan)
    then, now = saved.specs.get(host) or {}, spec_digests(config, config.host(host))
    changed = sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))
    if changed:
        what = ", ".join(f"host {host}'s venvs, models or GPUs" if k == HOST_KEY else
                         f"deployment {k}" + (" (added)" if k not in then else
                                              " (removed)" if k not in now else "")
                         for k in changed)
        raise RefusedError(f"{host}: {config.path} changed since the plan was made: {what}",
                           hint=f"make a new plan and review it: {_replan([host], plan_file)}")


def apply(
    ctx: typer.Context,
    hosts: list[str] = typer.Argument(None, help="hosts (default: those of the plan or all)"),
    plan_file: Path = typer.Option(None, "--plan", help="run exactly this saved plan"),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    concurrency: int = typer.Option(4, "--concurrency", min=1, max=32,
                                    help="hosts converged at once"),
    deadline: float = typer.Option(180.0, "--probe-deadline", min=1, max=MAX_WAIT_S,
                                   help="seconds each service's health probe may take"),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True,
                                help="-v: each command sent to a host, its exit and seconds, "
                                     "on stderr (secrets as ***); -vv: and what it prints, "
                                     "line by line as it comes"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Converge each host on its deployments: idempotent, resumable, one host's failure
    does not stop the others. Each step is said on stderr as it begins and ends (with its
    seconds; on a terminal a live status line and the lane copy's bars), the summary gives
    each step's seconds. Each host's run is logged under the state folder (runs/*.jsonl,
    mode 0600: who, when, each command, its exit and seconds, each step)."""
    from ddtree_deploy.cli.applyview import ApplyView, failure_output, summary
    from ddtree_deploy.converge.runlog import RunLog
    from ddtree_deploy.converge.runner import HostRun, apply_host, make_plan
    from ddtree_deploy.converge.steps import Plan, Step
    from ddtree_deploy.transport.fanout import exit_code, fan_out
    from ddtree_deploy.version import version_line

    config = config_of(ctx)
    if config.source == EMBEDDED:
        raise UsageError(f"apply would change the lab's hosts from {config.path}, the embedded "
                         "default found for want of a hosts file",
                         hint="name yours (--hosts FILE, $DDTREE_DEPLOY_HOSTS, ./hosts.yaml) or "
                              "ask for the lab: ddtree-deploy --lab apply ...")
    saved: Plan | None = None
    if plan_file is not None:
        text = read_input(plan_file, "--plan")
        try:
            saved = Plan.from_json(json.loads(text))
        except RecursionError:
            raise UsageError(f"{plan_file}: not a saved plan (nested too deeply)") from None
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise UsageError(f"{plan_file}: not a saved plan ({exc})") from None
        _check_version(saved, plan_file)
    names = hosts or (saved.hosts if saved else sorted({d.host for d in
                                                        config.deployments.values()}))
    for name in names:  # before anything is done: a typo is exit 2, no host touched, no log
        config.host(name)
    if not yes and not can_ask():
        raise UsageError("apply changes hosts: confirm on a terminal, or pass --yes")
    shown = threading.Lock()

    human = err if as_json else out  # under --json stdout holds the one document

    def show(host: str, steps: list[Step]) -> None:  # the plan each host runs, made under its lock
        with shown:
            _render(Plan([host], steps, {}, made_at=time.time()), human)
            if not any(s.pending for s in steps):
                human.print(f"apply: nothing to change on {host}; probing the services")

    if not yes:
        if saved is None:  # a preview to confirm; under its lock each host must still match it
            saved = make_plan(config, names, refresh=True)
            if len(saved.hosts) == 1 and saved.failures:  # nothing to confirm: its error
                raise next(iter(saved.failures.values()))
        else:
            human.print(plain(f"the saved plan {plan_file}, made "
                              f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(saved.made_at))}"
                              ":"), markup=False, highlight=False)
        _render(saved, human)  # what will run, shown before the question
        if not confirm(f"Apply to {', '.join(names)}?", err=as_json):
            if as_json:  # the one document says so
                raise RefusedError("apply was not confirmed: nothing was changed")
            raise typer.Exit(int(ExitCode.FAILED))

    def one(host: str) -> object:
        expected = saved.fingerprints.get(host) if saved else None
        if saved is not None and host in saved.errors:
            raise saved.failures.get(host) or DeployError(str(saved.errors[host].get("error")))
        if saved is not None and expected is None:
            raise UsageError(f"the saved plan has no steps for {host}")
        if saved is not None:
            assert plan_file is not None
            _check_specs(saved, config, host, plan_file)
        log = RunLog(host, say=view.say)
        log.start({"command": "apply", "hosts": names, "plan": str(plan_file) if plan_file
                   else None, "yes": yes}, str(config.path), version_line())
        view.say(f"{host}: run log {log.path}")
        return apply_host(config, host, expected_fingerprint=expected, log=log,
                          progress=view.progress_for(host), watch=view,
                          observers=(view.observer(host),) if verbose else (),
                          listeners=view.listeners(host),
                          probe_deadline=deadline,
                          on_plan=(lambda steps: show(host, steps)) if yes and saved is None
                          else None)

    # on a terminal: a live status line per host and the lane copy's bars; else plain lines
    with ApplyView(rich_console(err), verbose=verbose, terminal=is_tty(err)) as view:
        outcomes = fan_out(names, one, concurrency=concurrency)
    code = exit_code(outcomes)
    if as_json:
        print_results(out, [_applied(o.host, o.value) if o.ok and o.value is not None
                            else _failed(config, o.host, o.error or DeployError("failed"))
                            for o in outcomes], int(code))
        return
    for o in outcomes:
        if o.ok:
            run = o.value
            assert isinstance(run, HostRun)
            out.print(f"[green]{esc(o.host)}: converged[/green] ({len(run.done)} steps; "
                      f"{esc(run.verdict or 'no service')})", highlight=False)
            for line in summary(run):
                out.print(plain(line), markup=False, highlight=False)
        else:
            out.print(f"[red]{esc(o.host)}: failed[/red]: {esc(_masked(config, o.host, o.error))}",
                      highlight=False)
            if verbose >= 2 and o.error is not None:  # -vv: the failed command's whole stderr
                for line in failure_output(o.host, o.error):
                    view.say(line)
    if code:
        raise typer.Exit(int(code))


def _applied(host: str, run: Any) -> dict[str, Any]:
    """A converged host in apply's --json results: the steps it ran (with seconds), the
    services' verdict and where its run log is."""
    return {"host": host, "ok": True,
            "steps": [s.as_json() for s in run.done],
            "timings": [{"kind": kind, "title": title, "seconds": round(seconds, 3)}
                        for kind, title, seconds in run.timings],
            "verdict": run.verdict, "seconds": round(run.total_s, 3),
            "run_log": str(run.log.path) if run.log is not None else None}
