"""`ddtree-deploy venv clone HOST SRC DST` (thin)."""

from __future__ import annotations

import typer

from ddtree_deploy.cli.common import config_of, console, host_path, print_results
from ddtree_deploy.cli.text import plain
from ddtree_deploy.config.roles import refuse_write

app = typer.Typer(help="Venvs on a host.", no_args_is_help=True)
out = console(soft_wrap=True)


@app.callback()
def venv() -> None:
    """Venvs on a host."""


@app.command("clone")
def clone(ctx: typer.Context, host: str = typer.Argument(...),
          src: str = typer.Argument(..., help="the venv to copy (a path on the host)"),
          dst: str = typer.Argument(..., help="where the copy goes (must not exist)"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Copy a venv on its host: symlinks kept, scripts' shebangs and pyvenv.cfg fixed."""
    from ddtree_deploy.converge.steps._venv_clone import clone as do_clone
    from ddtree_deploy.facts.cache import FactsCache
    from ddtree_deploy.transport.connect import open_transport

    host_path(src, "SRC")
    host_path(dst, "DST")
    config = config_of(ctx)
    spec = config.host(host)
    refuse_write(spec, dst, "venv clone (into it)")  # cloning FROM a protected venv is fine
    with open_transport(config, spec) as t:
        result = do_clone(t, src, dst)
    FactsCache().drop(spec)
    if as_json:
        print_results(out, {"host": host, "src": src, "dst": dst,
                            "fixed_scripts": list(result.fixed_scripts)})
        return
    out.print(plain(f"{host}: {src} -> {dst} (fixed {len(result.fixed_scripts)} scripts: "
                    f"{', '.join(result.fixed_scripts) or '-'})"), markup=False, highlight=False)
