"""What `ddtree-deploy overlay ...` imports: its own command, not the whole tool.

An unchanged re-run of the overlay is meant to take under a second of the whole CLI's wall
time, and most of a short run is imports. The CLI adds only the command a run invokes
(cli/app.py `build_app(args)`), the overlay command loads the plan's renderer (rich) only for
--dry-run, the facts model only when a target changed, and the transfer's and apply's modules
only when something is sent (overlay/run.py). These tests run the CLI in a subprocess and read
its sys.modules, so an import that comes back at module level fails here (no clock involved).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer.main

from ddtree_deploy.cli import app as cli_app

# Modules the overlay command never needs: the other command groups and what they bring.
OTHER_COMMANDS = ("ddtree_deploy.cli.bench", "ddtree_deploy.cli.converge",
                  "ddtree_deploy.cli.hosts", "ddtree_deploy.cli.inventory",
                  "ddtree_deploy.cli.payload", "ddtree_deploy.cli.service",
                  "ddtree_deploy.cli.venv", "ddtree_deploy.facts.gather",
                  "ddtree_deploy.converge", "ddtree_deploy.bench", "ddtree_lab")
# ... and what an unchanged run needs none of (no bar drawn, nothing sent, nothing applied).
UNCHANGED_NEEDS_NONE = ("rich", "ddtree_deploy.overlay.render", "ddtree_deploy.facts.cache",
                        "ddtree_deploy.facts.model", "ddtree_deploy.overlay.relay",
                        "ddtree_deploy.overlay.transfer", "ddtree_deploy.overlay.apply",
                        "ddtree_deploy.overlay.densify", "paramiko", "fabric")

# Runs the CLI in-process with `run_fleet` answering "unchanged" for every target (no
# connection is made), then writes the loaded modules' names to argv[1].
_UNCHANGED_RUN = textwrap.dedent("""
    import json, sys
    import ddtree_deploy.overlay.run as run
    from ddtree_deploy.overlay.model import Endpoint, OverlayPlan

    def run_fleet(config, lane, targets, **kw):
        plans = [OverlayPlan(lane=lane.lane, source=Endpoint(host="ct129", venv="/root/ml-env"),
                             target=Endpoint(host=h, venv=v), id="0" * 64) for h, v in targets]
        return run.FleetResult([run.OverlayResult(h, v, plan=p)
                                for (h, v), p in zip(targets, plans)])

    run.run_fleet = run_fleet
    from ddtree_deploy.cli.app import main
    try:
        main(sys.argv[2:])
    except SystemExit as exc:
        code = exc.code
    with open(sys.argv[1], "w") as fh:
        json.dump({"code": code, "modules": sorted(sys.modules)}, fh)
""")


def _loaded(tmp_path: Path, script: str, *args: str) -> tuple[object, set[str], str]:
    out = tmp_path / "modules.json"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    proc = subprocess.run([sys.executable, "-c", script, str(out), *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.exists(), proc.stderr
    data = json.loads(out.read_text())
    return data["code"], set(data["modules"]), proc.stdout


def _hits(modules: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules for b in banned if m == b or m.startswith(b + "."))


@pytest.mark.integration  # the CLI in a subprocess
def test_overlay_help_imports_no_other_command(tmp_path: Path) -> None:
    script = ("import json, sys\nfrom ddtree_deploy.cli.app import main\ntry:\n"
              "    main(sys.argv[2:])\nexcept SystemExit as exc:\n    code = exc.code\n"
              "json.dump({'code': code, 'modules': sorted(sys.modules)}, open(sys.argv[1], 'w'))")
    code, modules, stdout = _loaded(tmp_path, script, "overlay", "--help")
    assert code == 0 and "--abi" in stdout
    assert "ddtree_deploy.cli.overlay" in modules
    assert _hits(modules, OTHER_COMMANDS) == []


@pytest.mark.integration
def test_an_unchanged_overlay_run_imports_only_what_it_uses(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("version: 1\nhosts:\n  ct129:\n    transport: local\n"
                     "  ct200:\n    transport: local\n")
    code, modules, stdout = _loaded(tmp_path, _UNCHANGED_RUN, "--hosts", str(hosts), "overlay",
                                    "--abi", "cu130", "--to", "ct200:/root/bv", "--json")
    assert code == 0, stdout
    assert json.loads(stdout)["results"]["result"] == "unchanged"
    assert "ddtree_deploy.overlay.lanefile" in modules  # the run did happen
    assert _hits(modules, OTHER_COMMANDS + UNCHANGED_NEEDS_NONE) == []


@pytest.mark.parametrize("args,command", [
    (["overlay", "--abi", "cu130"], "overlay"),
    (["--hosts", "h.yaml", "overlay", "rollback", "ct200"], "overlay"),
    (["--hosts=h.yaml", "plan", "ct200"], "plan"),
    (["--hosts"], None),  # its value missing: click says so, with every command known
    ([], None), (["--help"], None), (["--version"], None), (["--nosuch", "plan"], None),
    (["lab", "up"], None),  # a plugin's group: the plugins are looked up
    (["nosuch"], None),  # click's "No such command" sees them all
])
def test_the_invoked_command_is_read_past_the_roots_options(args: list[str],
                                                            command: str | None) -> None:
    assert cli_app.invoked(args) == command


def test_a_run_gets_its_command_and_anything_else_gets_every_command() -> None:
    every = typer.main.get_command(cli_app.build_app(["--help"]))
    names = set(every.commands)  # type: ignore[attr-defined]
    assert {"plan", "apply", "inventory", "doctor", "probe", "service", "payload", "venv",
            "overlay", "hosts", "bench", "lab"} <= names
    assert names == set(typer.main.get_command(cli_app.build_app()).commands)  # type: ignore[attr-defined]
    one = typer.main.get_command(cli_app.build_app(["overlay", "--abi", "cu130"]))
    assert set(one.commands) == {"overlay"}  # type: ignore[attr-defined]
    plan = typer.main.get_command(cli_app.build_app(["plan", "ct200"]))
    assert set(plan.commands) == {"plan"}  # type: ignore[attr-defined]
