"""`ddtree-deploy hosts list | check | trust | disconnect` (thin: parse, call, render).

HOST is a name from the hosts file; `trust` also takes `addr`, `addr:port` or
`[addr]:port` for a host not in the file (keys then go to ~/.ssh/known_hosts).
"""

from __future__ import annotations

import typer

from ddtree_deploy.cli.common import (
    MAX_WAIT_S,
    WIDE_HELP,
    config_of,
    confirm,
    console,
    host_failure,
    hosts_or_all,
    print_results,
)
from ddtree_deploy.config.hosts import LOCALHOST
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.transport.fanout import exit_code, fan_out
from ddtree_deploy.transport.hostkeys import (
    TrustTarget,
    default_resolver,
    names_an_ip,
    trust_target,
)


def _ask(question: str, *, err: bool = False) -> bool:
    try:
        return confirm(question, err=err)
    except typer.Abort:  # end of input: no answer is a no
        return False


def resolve(ctx: typer.Context, host: str) -> TrustTarget:
    """A host of the hosts file (localhost: this machine, as everywhere), else an address.
    A hosts file with an error is that error (exit 2), unless HOST is an IP address (which
    needs no hosts file); a name is never looked up in DNS past a broken file."""
    try:
        config = config_of(ctx)
    except ConfigError:
        if not names_an_ip(host):
            raise
        return default_resolver(host)
    known = {**config.hosts, LOCALHOST: config.host(LOCALHOST)}
    return trust_target(known, host)


app = typer.Typer(help="Hosts of the hosts file: list, check over SSH, trust keys.",
                  no_args_is_help=True)
out = console()
AS_JSON = typer.Option(False, "--json")


@app.command("list")
def list_hosts(ctx: typer.Context,
               wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
               as_json: bool = AS_JSON) -> None:
    """The hosts and deployments of the hosts file (validated in full)."""
    from ddtree_deploy.cli.render_table import add_row, make_table, show

    config = config_of(ctx)
    if as_json:  # every field, defaults filled in: what the tool reads from the file
        print_results(out, {
            "file": str(config.path),
            "hosts": {n: h.model_dump(mode="json") for n, h in config.hosts.items()},
            "deployments": {n: d.model_dump(mode="json") for n, d in config.deployments.items()},
        })
        return
    table = make_table(f"hosts ({config.path})", ("host", "target", "user", "GPUs expected",
                                                   "venvs"))
    for name, spec in config.hosts.items():
        gpus = f"{spec.gpus.count}x {spec.gpus.model or ''}".strip() if spec.gpus else "-"
        venvs = ", ".join(f"{v}={p.path}" for v, p in spec.venvs.items())
        where = "local (no SSH)" if spec.is_local else f"{spec.target}:{spec.port}"
        add_row(table, name, where, "-" if spec.is_local else spec.user, gpus, venvs)
    deps = make_table("deployments", ("deployment", "host", "venv", "lane", "algorithm", "gpu",
                                      "port"))
    for name, dep in config.deployments.items():
        add_row(deps, name, dep.host, dep.venv, dep.cuda_lane, dep.algorithm,
                     str(dep.gpu if dep.gpu is not None else "auto"),
                     str(dep.port if dep.port is not None else "auto"))
    show(out, table, deps, wide=wide)


@app.command("check")
def check(
    ctx: typer.Context,
    hosts: list[str] = typer.Argument(None, help="hosts to check (default: all)"),
    concurrency: int = typer.Option(8, "--concurrency", min=1, max=64,
                                    help="hosts asked at once"),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    as_json: bool = AS_JSON,
) -> None:
    """Connect to each host over SSH and show what answers (GPUs, declared venvs)."""
    from dataclasses import asdict

    from ddtree_deploy.cli.render_table import add_row, make_table, notes, show
    from ddtree_deploy.cli.text import cell
    from ddtree_deploy.hostcheck import check_host

    config = config_of(ctx)
    names = hosts_or_all(config, hosts)
    outcomes = fan_out(names, lambda h: check_host(config, config.host(h)),
                       concurrency=concurrency)
    code = int(exit_code(outcomes))
    if as_json:
        print_results(out, [{**asdict(o.value), "ok": True} if o.value is not None
                            else host_failure(o.host, o.error or ConfigError("failed"))
                            for o in outcomes], code)
        return
    table = make_table("hosts check", ("host", "status", "hostname", "GPUs (used/total MiB)",
                                       "venvs"))
    for o in outcomes:
        if o.value is None:  # the error goes under the table, whole (a fingerprint is not cut)
            add_row(table, o.host, cell("failed", "red"), "(below)", "", "")
            continue
        c = o.value
        models = sorted({g.name for g in c.gpus})
        gpus = "\n".join([f"{len(c.gpus)}x {', '.join(models)}"] if c.gpus else [])
        gpus += "".join(f"\n GPU{g.index}: {g.memory}" for g in c.gpus)
        venvs = "\n".join(f"{'ok' if ok else 'MISSING'} {p}" for p, ok in c.venvs.items())
        add_row(table, o.host, cell("ok", "green"), c.hostname, gpus or c.gpu_error, venvs)
    show(out, table, *notes((o.host, str(o.error)) for o in outcomes if o.value is None),
         wide=wide)
    if code:
        raise typer.Exit(code)


@app.command("trust")
def trust(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="host name from hosts.yaml, or addr[:port]"),
    yes: bool = typer.Option(False, "--yes", "-y", help="record the key without asking"),
    connect_timeout: float = typer.Option(None, "--timeout", min=0.1, max=MAX_WAIT_S,
                                          help="seconds to wait for the host (default: its "
                                               "connect_timeout, 10 for an address)"),
    as_json: bool = AS_JSON,
) -> None:
    """Show HOST's SSH key fingerprint and record it in known_hosts after confirmation."""
    from ddtree_deploy.transport.hostkeys import HostKeyChangedError
    from ddtree_deploy.transport.hostscan import trust_host
    from ddtree_deploy.transport.openssh import end_masters_for

    target = resolve(ctx, host)
    try:
        outcome = trust_host(
            target.address,
            target.port,
            target.known_hosts,
            confirm=(lambda _q: True) if yes else (lambda q: _ask(q, err=as_json)),
            timeout=target.connect_timeout if connect_timeout is None else connect_timeout,
            label=target.label,
        )
    except HostKeyChangedError:
        end_masters_for(target.address, target.port)  # facts must not read the old host
        raise
    if as_json:  # declined: exit 1, as below
        print_results(out, {"host": outcome.name, "status": outcome.status,
                            "keytype": outcome.keytype, "fingerprint": outcome.fingerprint,
                            "known_hosts": str(outcome.known_hosts)},
                      int(outcome.status == "declined"))
        return
    shown = f"{outcome.name}: {outcome.keytype} {outcome.fingerprint}"
    if outcome.status == "already-known":
        typer.echo(f"{shown} is already known ({outcome.known_hosts}); nothing to do")
    elif outcome.status == "added":
        typer.echo(f"{shown} recorded in {outcome.known_hosts}")
    else:
        typer.echo(f"{shown} NOT recorded (not confirmed)", err=True)
        raise typer.Exit(1)


@app.command("disconnect")
def disconnect(
    ctx: typer.Context,
    hosts: list[str] = typer.Argument(None, help="hosts whose connection to end (default: all)"),
    as_json: bool = AS_JSON,
) -> None:
    """End the OpenSSH master connections that facts gathering keeps open (ssh_persist)."""
    from ddtree_deploy.transport import openssh
    from ddtree_deploy.transport.connect import openssh_transport

    if not openssh.available():
        if as_json:  # no client: no connection is kept, none ended
            print_results(out, [])
            return
        out.print("no OpenSSH client here: no kept connections")
        return
    config = config_of(ctx)
    ended: list[dict[str, object]] = []
    for name in hosts_or_all(config, hosts):
        spec = config.host(name)
        if spec.is_local:
            continue
        done = openssh_transport(spec).disconnect()
        ended.append({"host": name, "ended": done})
        if not as_json:
            out.print(f"{name}: {'connection ended' if done else 'no kept connection'}")
    if as_json:
        print_results(out, ended)
