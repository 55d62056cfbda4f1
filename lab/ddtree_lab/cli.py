"""`ddtree-deploy lab up | down | status` (thin: parse, call, render)."""

from __future__ import annotations

from dataclasses import asdict

import typer

from ddtree_deploy.cli.common import console, print_results
from ddtree_deploy.cli.helptext import EXAMPLE
from ddtree_deploy.errors import ExitCode

app = typer.Typer(help="The local lab: systemd-nspawn hosts ct129 and ct200 (a rehearsal).",
                  epilog=EXAMPLE + "ddtree-deploy lab status",
                  no_args_is_help=True)
err = console(stderr=True)
out = console()


def _say(msg: str) -> None:
    from rich.text import Text

    err.print(Text.assemble(("lab: ", "dim"), msg))  # msg may quote a command line: as text


WAIT_HELP = ("if another process holds the lab, wait up to SECONDS for it "
             "(default: refuse at once, naming the holder)")


@app.command(epilog=EXAMPLE + "ddtree-deploy lab up --extra 1 --wait 600")
def up(extra: int = typer.Option(0, "--extra", min=0, max=50,
                                 help="add N more hosts like ct200 (ct201, ...)"),
       wait: float = typer.Option(0.0, "--wait", min=0, metavar="SECONDS", help=WAIT_HELP),
       link_rate: str | None = typer.Option(
           None, "--link-rate", metavar="RATE",
           help="shape each host's link to RATE both ways (tc tbf; 1gbit, 500mbit); "
                "unshaped again by `lab down` and by the next `lab up`"),
       ) -> None:
    """Bring the lab up (clearing leftovers of an earlier run first)."""
    from ddtree_deploy.cli.render_table import add_row, make_table
    from ddtree_lab import manager

    with err.status("lab up ..."):
        hosts = manager.up(extra=extra, report=_say, wait_s=wait, link_rate=link_rate)
    table = make_table("lab hosts", ("host", "address", "GPUs", "venvs"))
    for h in hosts:
        add_row(table, h.name, h.address, f"{len(h.gpus)}x {h.gpus[0].name}",
                ", ".join(v.path for v in h.venvs))
    out.print(table)


@app.command(epilog=EXAMPLE + "ddtree-deploy lab down --purge")
def down(purge: bool = typer.Option(False, "--purge",
                                    help="also remove the caches (rootfs, wheels) and lab keys"),
         wait: float = typer.Option(0.0, "--wait", min=0, metavar="SECONDS", help=WAIT_HELP),
         ) -> None:
    """Take the lab down: no containers, mounts, namespaces or daemons are left."""
    from ddtree_lab import manager

    removed = manager.down(purge=purge, report=_say, wait_s=wait)
    out.print(f"lab down: removed {len(removed)} items" if removed else "lab down: nothing to do")


@app.command(epilog=EXAMPLE + "ddtree-deploy lab status --json")
def status(as_json: bool = typer.Option(False, "--json")) -> None:
    """Show each lab host: container running, sshd answering."""
    from ddtree_deploy.cli.render_table import add_row, make_table
    from ddtree_lab import manager

    rows = manager.status()
    # down (no hosts), or a host not running or not answering: 1
    code = int(ExitCode.FAILED) if not rows or not all(r.running and r.ssh for r in rows) else 0
    if as_json:
        print_results(out, [asdict(r) for r in rows], code)
        return
    table = make_table("lab status", ("host", "address", "container", "ssh"))
    for r in rows:
        add_row(table, r.name, r.address, f"running (pid {r.pid})" if r.running else "stopped",
                "up" if r.ssh else "down")
    out.print(table if rows else "lab is down")
    if code:
        raise typer.Exit(code)

