"""Command groups that other distributions add to the command line.

A distribution names a Typer app in the entry point group ``ddtree_deploy.commands``; the entry
point's name becomes the command group (``ddtree-deploy NAME ...``). The tool imports none of them
by name. A group the README documents whose distribution is not installed stays a command that
says which distribution to install and exits 2 (usage), so its commands never fall through to
typer's "No such command".
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

GROUP = "ddtree_deploy.commands"

# Command groups documented in the README that ship in a distribution of their own.
EXPECTED = {"lab": "ddtree-deploy-lab"}


def add_to(app: typer.Typer, reserved: frozenset[str] = frozenset()) -> None:
    """Add every installed plugin group to ``app``, and a stand-in for each expected one missing.

    A plugin named like a built-in command (``reserved``) is not added: the built-in is what
    both the help and a run of that name get (a run imports only the built-in it names)."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=GROUP) if ep.name not in reserved}
    for name in sorted(EXPECTED.keys() - reserved | found.keys()):
        ep = found.get(name)
        if ep is None:
            _missing(app, name, f"it is not installed (install the {EXPECTED[name]} package)")
            continue
        try:
            sub = ep.load()
        except Exception as exc:  # a broken plugin must not take the other commands down
            _missing(app, name, f"it cannot be loaded from {ep.value}: {exc}")
            continue
        app.add_typer(sub, name=name)


def _missing(app: typer.Typer, name: str, why: str) -> None:
    import typer

    def unavailable() -> None:
        sys.stderr.write(f"error: `ddtree-deploy {name}` is unavailable: {why}\n")
        raise typer.Exit(2)

    app.command(
        name=name, help="Unavailable here: run it for the reason.", add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(unavailable)
