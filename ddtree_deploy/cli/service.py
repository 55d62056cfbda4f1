"""`ddtree-deploy service render | up | down | status | logs | list` and `probe` (thin)."""

from __future__ import annotations

from typing import Any

import typer

from ddtree_deploy import __version__
from ddtree_deploy.cli.common import (
    MAX_PID,
    MAX_WAIT_S,
    WIDE_HELP,
    config_of,
    console,
    print_results,
)
from ddtree_deploy.cli.text import esc, plain
from ddtree_deploy.config.hosts import Config, HostSpec
from ddtree_deploy.errors import DeployError, UsageError

app = typer.Typer(help="SGLang services on a host: render, up, down, status, logs, list.",
                  no_args_is_help=True)
out = console(soft_wrap=True)
err = console(stderr=True, soft_wrap=True)


def _facts(config: Config, spec: HostSpec, venvs: list[str], refresh: bool) -> Any:
    from ddtree_deploy.facts.cache import FactsCache
    from ddtree_deploy.facts.gather import collect

    (outcome,) = collect(config, [spec.name], cache=FactsCache(), refresh=refresh,
                         extra_venvs={spec.name: venvs})
    if outcome.value is None:
        assert outcome.error is not None
        raise outcome.error
    return outcome.value


def _drop_facts(spec: HostSpec) -> None:
    from ddtree_deploy.facts.cache import FactsCache

    FactsCache().drop(spec)


@app.command("render")
def render(
    ctx: typer.Context,
    host: str = typer.Argument(...),
    name: str = typer.Argument(..., help="a deployment of the hosts file"),
    verify: bool = typer.Option(True, "--verify/--no-verify",
                                help="check the unit with systemd-analyze on the host"),
    as_json: bool = typer.Option(False, "--json", help="the unit and what it runs (argv, "
                                 "environment, working directory) as JSON (docs/json.md)"),
) -> None:
    """Print the unit of deployment NAME (checked with systemd-analyze verify on HOST).

    The deployment's secret files must be readable (exit 2 otherwise): the unit is the one
    apply would install with them. plan, by contrast, still plans and shows the unreadable
    file as the unit.install step's reason."""
    from ddtree_deploy.service import endpoint
    from ddtree_deploy.service.render import render_unit, unit_command
    from ddtree_deploy.service.resolve import build_spec
    from ddtree_deploy.service.verify import verify_unit
    from ddtree_deploy.transport.connect import open_transport

    config = config_of(ctx)
    spec_host = config.host(host)
    dep = config.deployment(name)
    if dep.host != spec_host.name:
        raise UsageError(f"deployment '{name}' runs on {dep.host}, not on {spec_host.name}")
    endpoint.read_secrets(dep.api_key_file, dep.hf_token_file, dep.name)  # ConfigError: exit 2
    venv = str(spec_host.venvs[dep.venv].path)
    facts = _facts(config, spec_host, [venv], refresh=True)
    spec = build_spec(config, spec_host, facts, dep, force=True, require_venv=False)
    found = facts.venv(venv)
    if found is None or not found.exists:
        err.print(plain(f"warning: {venv} does not exist on {spec_host.name} yet: "
                        "LD_LIBRARY_PATH is empty and verification will fail until it does"),
                  soft_wrap=True, markup=False, highlight=False)
    text = render_unit(spec, tool_version=__version__)
    if not as_json:  # the unit first, for a person; under --json one document, after the check
        # render_unit refuses control characters; plain() keeps a terminal safe regardless
        typer.echo(plain(text), nl=False)
    if verify:
        with open_transport(config, spec_host) as t:
            verify_unit(t, text, spec.unit_name)
        err.print(plain(f"{spec.unit_name}: systemd-analyze verify passed on {spec_host.name}"),
                  markup=False, highlight=False)
    if as_json:
        print_results(out, {"unit_name": spec.unit_name, "unit": text, "verified": verify,
                            **unit_command(spec).as_json()})


@app.command("up")
def up(
    ctx: typer.Context,
    host: str = typer.Argument(...),
    name: str = typer.Argument(None, help="a deployment of the hosts file (flags override it)"),
    # server settings: their ranges and rules are ServerSettings' own (settings/model.py)
    gpu: int = typer.Option(None, "--gpu", help="the first GPU (default: a free one)"),
    port: int = typer.Option(None, "--port", help="1-65535 (default: a free one)"),
    venv: str = typer.Option(None, "--venv", help="the venv to serve from (a path on the "
                                                  "host; needed without a deployment)"),
    algorithm: str = typer.Option(None, "--algorithm", help="none | dflash | ddtree"),
    model_path: str = typer.Option(None, "--model-path",
                                   help="the target model (a folder on the host)"),
    draft_model_path: str = typer.Option(None, "--draft-model-path",
                                         help="the DFlash drafter (a folder on the host)"),
    budget: int = typer.Option(None, "--ddtree-budget", help="tree nodes per round, 1-1024"),
    topk: int = typer.Option(None, "--ddtree-topk", help="candidates per depth, 1-1024"),
    attention_backend: str = typer.Option(None, "--attention-backend",
                                          help="SGLang's --attention-backend (e.g. triton, "
                                               "flashinfer, fa3)"),
    grammar_backend: str = typer.Option(None, "--grammar-backend",
                                        help="SGLang's --grammar-backend (e.g. xgrammar, "
                                             "none)"),
    sampling_backend: str = typer.Option(None, "--sampling-backend",
                                         help="flashinfer | pytorch | ascend"),
    mem_fraction_static: float = typer.Option(None, "--mem-fraction-static",
                                              help="the GPU memory share for weights and "
                                                   "KV cache, 0-1"),
    service_name: str = typer.Option(None, "--name", help="unit name without a deployment"),
    force: bool = typer.Option(False, "--force", help="use a busy GPU or taken port anyway"),
    deadline: float = typer.Option(180.0, "--deadline", min=1, max=MAX_WAIT_S,
                                   help="seconds for the probe"),
    no_probe: bool = typer.Option(False, "--no-probe", help="install and start only"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Render, verify, install and (re)start a service, then probe it."""
    from ddtree_deploy.converge.steps.service_probe import target_of
    from ddtree_deploy.converge.steps.unit_install import install_unit
    from ddtree_deploy.service import install
    from ddtree_deploy.service.resolve import build_spec, check_service_flags, settings_for
    from ddtree_deploy.settings.layers import flag_layer
    from ddtree_deploy.transport.connect import open_transport

    config = config_of(ctx)
    spec_host = config.host(host)
    dep = config.deployment(name) if name else None
    if dep is not None and dep.host != spec_host.name:
        raise UsageError(f"deployment '{name}' runs on {dep.host}, not on {spec_host.name}")
    # the deployment, then the flags: merged and validated before any host is contacted
    check_service_flags(dep, name=service_name, venv=venv)
    settings = settings_for(config, spec_host, dep, flag_layer({
        ("gpu",): gpu, ("port",): port, ("algorithm",): algorithm,
        ("model_path",): model_path, ("draft_model_path",): draft_model_path,
        ("ddtree", "budget"): budget, ("ddtree", "topk"): topk,
        ("attention_backend",): attention_backend, ("grammar_backend",): grammar_backend,
        ("sampling_backend",): sampling_backend, ("mem_fraction_static",): mem_fraction_static,
    }))
    venvs = [venv] if venv else ([str(spec_host.venvs[dep.venv].path)] if dep else [])
    facts = _facts(config, spec_host, venvs, refresh=True)
    spec = build_spec(config, spec_host, facts, dep, settings, name=service_name, venv=venv,
                      force=force)
    with open_transport(config, spec_host) as t:  # the unit as apply's unit.install puts it
        text, changed = install_unit(t, spec, dep)
        _drop_facts(spec_host)
        install.restart(t, spec.unit_name)
        err.print(f"{spec.unit_name} on {spec_host.name}: "
                  f"{'installed' if changed else 'unchanged'}, restarted "
                  f"(GPU {','.join(map(str, spec.gpus))}, port {spec.port})")
        started = {"host": spec_host.name, "unit_name": spec.unit_name, "installed": changed,
                   "restarted": True, "gpus": list(spec.gpus), "port": spec.port}
        if no_probe:
            if as_json:
                print_results(out, {**started, "probe": None})
            return
        target = target_of(text, spec.unit_name, spec_host.name, port=spec.port)
        assert target is not None
        _probe_and_exit(t, spec.unit_name, target.port, deadline, as_json=as_json,
                        input_ids=target.input_ids, results=started)


def _probe_and_exit(t: Any, unit: str | None, port: int, deadline: float, *, as_json: bool,
                    pid: int | None = None, log_file: str | None = None,
                    warmup: float | None = None, input_ids: bool | None = None,
                    results: dict[str, Any] | None = None) -> None:
    """Probe, say the verdict and exit with its code; under --json the verdict is the
    results, or their `probe` when `results` (service up's) are given."""
    from ddtree_deploy.health.check import WARMUP_S, ProbeTarget, probe_service

    label = unit or f"port {port}"
    with err.status(f"probing {label} ...") as status:
        verdict = probe_service(t, ProbeTarget(port=port, unit=unit, pid=pid, log_file=log_file,
                                               host=t.host, input_ids=input_ids),
                                deadline_s=deadline, warmup_s=warmup or WARMUP_S,
                                on_status=lambda s: status.update(esc(f"{label}: {s}")))
    if as_json:
        print_results(out, verdict.to_json() if results is None
                      else {**results, "probe": verdict.to_json()}, int(verdict.exit_code))
        return
    _render_verdict(label, verdict)
    if verdict.exit_code:
        raise typer.Exit(int(verdict.exit_code))


def _render_verdict(unit: str, verdict: Any) -> None:
    style = {"healthy": "green", "unhealthy": "bold red", "deadline": "yellow"}[verdict.status]
    out.print(f"[{style}]{esc(unit)}: {verdict.status}[/{style}] after {verdict.elapsed_s:.1f}s "
              f"({verdict.warmup_s:.1f}s of it warming up): ", end="", highlight=False)
    out.print(plain(verdict.reason), markup=False, highlight=False)  # server text: never markup
    for m in verdict.diagnosis:
        out.print(f"  [bold]{esc(m.diagnosis)}[/bold]", highlight=False)  # may quote a log
        if m.line.strip():  # a signature's log line (the probe's own hints have none)
            out.print(plain(f"    log: {m.line.strip()}"), markup=False, highlight=False)
        out.print(f"    fix: {m.remedy}", markup=False, highlight=False)
        out.print(f"    more: docs/troubleshooting.md#{m.id}", markup=False, highlight=False)
    from_log = any(m.line.strip() for m in verdict.diagnosis)
    if verdict.status != "healthy" and not from_log and verdict.log_tail:
        out.print("  last log lines:")
        for line in verdict.log_tail[-10:]:
            out.print(plain(f"    {line}"), markup=False, highlight=False)


@app.command("down")
def down(
    ctx: typer.Context,
    host: str = typer.Argument(...),
    name: str = typer.Argument(..., help="the service (deployment or unit name)"),
    remove: bool = typer.Option(False, "--remove", help="also delete the unit file"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Stop and disable one of the tool's services (others' units are never touched)."""
    from ddtree_deploy.service import install
    from ddtree_deploy.transport.connect import open_transport

    config = config_of(ctx)
    spec_host = config.host(host)
    unit = _unit_of(config, name)
    with open_transport(config, spec_host) as t:
        found = install.down(t, unit, remove=remove)
    if not found:
        raise DeployError(f"{unit}: no such ddtree-deploy service on {host} "
                          "(`service list` shows them)")
    _drop_facts(spec_host)
    if as_json:
        print_results(out, {"host": spec_host.name, "unit": unit, "stopped": True,
                            "removed": remove})
        return
    done = "stopped" + (" and removed" if remove else "")
    out.print(plain(f"{unit}: {done}"), markup=False, highlight=False)


def _unit_of(config: Config, name: str) -> str:
    if name in config.deployments:
        return config.deployments[name].unit_name
    return name if name.endswith(".service") else f"{name}.service"


@app.command("list")
def list_(ctx: typer.Context, host: str = typer.Argument(...),
          as_json: bool = typer.Option(False, "--json"),
          wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)) -> None:
    """The services this tool created on HOST, with their state."""
    from ddtree_deploy.cli.render_table import add_row, make_table, show
    from ddtree_deploy.service import install
    from ddtree_deploy.transport.connect import open_transport

    config = config_of(ctx)
    with open_transport(config, config.host(host)) as t:
        states = install.list_units(t)
    if as_json:
        print_results(out, [s.__dict__ for s in states])
        return
    table = make_table(f"ddtree-deploy services on {host}", (
        "unit", "deployment", "active", "sub", "main pid", "restarts", "exit status"))
    for s in states:
        add_row(table, s.unit, s.deployment or "-", s.active, s.sub, str(s.main_pid),
                str(s.restarts), str(s.exit_status))
    if states:
        show(out, table, wide=wide)
    else:
        out.print(f"no ddtree-deploy services on {host}", markup=False)


@app.command("status")
def status(ctx: typer.Context, host: str = typer.Argument(...),
           name: str = typer.Argument(None), as_json: bool = typer.Option(False, "--json")
           ) -> None:
    """State of one service (or all of the tool's services) on HOST."""
    from ddtree_deploy.service import install
    from ddtree_deploy.transport.connect import open_transport

    config = config_of(ctx)
    with open_transport(config, config.host(host)) as t:
        states = install.list_units(t)
    if name:
        unit = _unit_of(config, name)
        states = [s for s in states if s.unit == unit]
        if not states:
            raise DeployError(f"{unit}: no such ddtree-deploy service on {host}")
    code = 1 if any(s.active != "active" for s in states) else 0
    if as_json:
        print_results(out, [s.__dict__ for s in states], code)
        return
    if not states:
        out.print(plain(f"no ddtree-deploy services on {host}"), markup=False,
                  highlight=False)
    for s in states:
        out.print(plain(f"{s.unit}: {s.active}/{s.sub} pid {s.main_pid} "
                        f"restarts {s.restarts}"), markup=False, highlight=False)
    if code:
        raise typer.Exit(code)


@app.command("logs")
def logs(ctx: typer.Context, host: str = typer.Argument(...), name: str = typer.Argument(...),
         lines: int = typer.Option(200, "-n", "--lines", min=1, max=100000,
                                   help="the last N lines of the log"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """The service's journal (last N lines)."""
    from ddtree_deploy.service import install
    from ddtree_deploy.transport.connect import open_transport

    config = config_of(ctx)
    unit = _unit_of(config, name)
    with open_transport(config, config.host(host)) as t:
        if unit not in {s.unit for s in install.list_units(t)}:
            raise DeployError(f"{unit}: no such ddtree-deploy service on {host} "
                              "(`service list` shows them)")
        text = install.logs(t, unit, lines)
    if as_json:  # the journal's text as it is (JSON escapes its control bytes)
        print_results(out, {"host": host, "unit": unit, "lines": text.splitlines()})
        return
    typer.echo(plain(text), nl=False)  # the journal's ESC and other control bytes, escaped


def probe(
    ctx: typer.Context,
    host: str = typer.Argument(...),
    service: str = typer.Argument(
        None, help="deployment or unit (default: the host's only one; none with --port and "
                   "--pid on a host without systemd)"),
    deadline: float = typer.Option(120.0, "--deadline", min=0.5, max=MAX_WAIT_S,
                                  help="seconds before giving up"),
    port: int = typer.Option(None, "--port", min=1, max=65535,
                             help="the service's port (default: from its unit)"),
    pid: int = typer.Option(None, "--pid", min=1, max=MAX_PID,
                            help="without systemd: the server's process id (its exit is a crash)"),
    log_file: str = typer.Option(None, "--log-file",
                                 help="without systemd: the server's log file on the host, read "
                                      "for crash signatures as the journal is"),
    warmup: float = typer.Option(300.0, "--warmup", min=0.5, max=MAX_WAIT_S,
                                 help="seconds the greedy and sampled generations may wait for "
                                      "their first tokens (JIT compiles), apart from --deadline"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Is the service healthy? Fail-fast on crashes (known signatures), bounded by --deadline;
    healthy when a greedy and a sampled generation answered (first tokens within --warmup)."""
    from ddtree_deploy.converge.steps.service_probe import target_of
    from ddtree_deploy.service import install
    from ddtree_deploy.transport.connect import open_transport

    config = config_of(ctx)
    spec_host = config.host(host)
    if log_file is not None and (not log_file.startswith("/") or "\0" in log_file):
        raise UsageError(f"--log-file must be an absolute path on {host}, got {log_file!r}")
    plain = service is None and port is not None and (pid is not None or log_file is not None)
    unit: str | None = None
    if not plain:
        if service is None:
            deps = config.deployments_on(spec_host)
            if len(deps) != 1:
                raise UsageError(f"name the service to probe on {host} (or give --port with "
                                 "--pid/--log-file for a server without systemd)")
            service = deps[0].name
        unit = _unit_of(config, service)
    with open_transport(config, spec_host) as t:
        text = ""
        if port is None and unit is not None:
            text = install.current_text(t, unit) or ""
        target = target_of(text, unit, t.host, port=port)  # as apply's service.probe reads it
        if target is None:
            raise UsageError(f"cannot tell {unit}'s port on {host}: give --port")
        _probe_and_exit(t, unit, target.port, deadline, as_json=as_json, pid=pid,
                        log_file=log_file, warmup=warmup, input_ids=target.input_ids)
