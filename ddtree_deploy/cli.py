"""The ddtree-deploy command line: thin (parse, call, render).

Every command shares the exit codes of errors.ExitCode; a DeployError becomes its
message and exit code, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from ddtree_deploy import (
    __version__,
    cli_converge,
    cli_hosts,
    cli_inventory,
    cli_lab,
    cli_overlay,
    cli_payload,
    cli_service,
    cli_venv,
)
from ddtree_deploy.cli_common import console
from ddtree_deploy.errors import DeployError

app = typer.Typer(
    name="ddtree-deploy",
    help="Get a DDTree speculative-decoding build of SGLang running on GPU hosts over SSH.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command()(cli_converge.plan)
app.command()(cli_converge.apply)
app.command()(cli_inventory.inventory)
app.command()(cli_inventory.doctor)
app.command()(cli_service.probe)
app.add_typer(cli_service.app, name="service")
app.add_typer(cli_payload.app, name="payload")
app.add_typer(cli_venv.app, name="venv")
app.add_typer(cli_overlay.app, name="overlay")
app.add_typer(cli_hosts.app, name="hosts")
app.add_typer(cli_lab.app, name="lab")

err = console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddtree-deploy {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    hosts: str = typer.Option(None, "--hosts", metavar="FILE",
                              help="hosts file (default: $DDTREE_DEPLOY_HOSTS, ./hosts.yaml, "
                                   "XDG config, the embedded lab file)"),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True),
) -> None:
    ctx.obj = {"hosts": hosts}


def main(argv: list[str] | None = None) -> None:
    """Console entry point; typer handles usage errors (exit 2) and exits itself."""
    try:
        app(args=argv)
    except DeployError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
