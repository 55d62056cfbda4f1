"""`ddtree-deploy hosts ...`: host-key trust (the thin CLI over transport.hostkeys).

The sub-app learns where a host lives through a resolver passed in by the main
CLI (normally backed by hosts.yaml); without one, HOST is read as
`addr`, `addr:port` or `[addr]:port` and keys go to the default known_hosts file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer

from ddtree_deploy import paths
from ddtree_deploy.errors import DeployError, UsageError
from ddtree_deploy.transport.hostkeys import trust_host


@dataclass(frozen=True)
class TrustTarget:
    label: str
    address: str
    port: int
    known_hosts: Path


Resolver = Callable[[str], TrustTarget]

_BRACKETED = re.compile(r"\[(?P<addr>[^\]]+)\]:(?P<port>\d+)\Z")


def default_known_hosts() -> Path:
    return paths.config_dir() / "known_hosts"


def parse_address(text: str) -> tuple[str, int]:
    """`host`, `host:port`, `[host]:port` (IPv6 in brackets) -> (address, port)."""
    text = text.strip()
    if "@" in text:
        text = text.split("@", 1)[1]
    match = _BRACKETED.match(text)
    if match:
        address, port_text = match["addr"], match["port"]
    elif text.count(":") == 1:
        address, port_text = text.split(":")
    else:
        address, port_text = text, "22"
    if not address or any(c.isspace() for c in address) or address.startswith("-"):
        raise UsageError(f"not a host address: {text!r}")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"not a TCP port: {port_text!r} (in {text!r})")
    return address, int(port_text)


def default_resolver(host: str) -> TrustTarget:
    address, port = parse_address(host)
    return TrustTarget(host, address, port, default_known_hosts())


def _ask(question: str) -> bool:
    try:
        return bool(typer.confirm(question, default=False))
    except typer.Abort:  # end of input: no answer is a no
        return False


def make_hosts_app(resolve: Resolver | None = None, *, timeout: float = 10.0) -> typer.Typer:
    """The `hosts` sub-app; `resolve` maps a HOST argument to where and what to trust."""
    app = typer.Typer(help="Host keys and reachability.", no_args_is_help=True)
    resolver = resolve or default_resolver

    @app.callback()
    def hosts() -> None:
        """Host keys and reachability."""

    @app.command("trust")
    def trust(
        host: str = typer.Argument(..., help="host name from hosts.yaml, or addr[:port]"),
        yes: bool = typer.Option(False, "--yes", "-y", help="record the key without asking"),
        connect_timeout: float = typer.Option(
            timeout, "--timeout", min=0.1, help="seconds to wait for the host"
        ),
    ) -> None:
        """Show HOST's SSH key fingerprint and record it in known_hosts after confirmation."""
        try:
            target = resolver(host)
            outcome = trust_host(
                target.address,
                target.port,
                target.known_hosts,
                confirm=(lambda _q: True) if yes else _ask,
                timeout=connect_timeout,
                label=target.label,
            )
        except DeployError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(int(exc.exit_code)) from None
        shown = f"{outcome.name}: {outcome.keytype} {outcome.fingerprint}"
        if outcome.status == "already-known":
            typer.echo(f"{shown} is already known ({outcome.known_hosts}); nothing to do")
        elif outcome.status == "added":
            typer.echo(f"{shown} recorded in {outcome.known_hosts}")
        else:
            typer.echo(f"{shown} NOT recorded (not confirmed)", err=True)
            raise typer.Exit(1)

    return app


app = make_hosts_app()
