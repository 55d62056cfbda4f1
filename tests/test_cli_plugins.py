"""Command groups from other distributions (entry point group ddtree_deploy.commands): found and
added, or, when an expected one is missing or broken, a command that says why and exits 2."""

from __future__ import annotations

import importlib.metadata
import textwrap
from pathlib import Path

import pytest

from ddtree_deploy import cli_plugins
from ddtree_deploy.cli import app as cli


def _only(monkeypatch: pytest.MonkeyPatch, *eps: importlib.metadata.EntryPoint) -> None:
    def entry_points(**select: str) -> list[importlib.metadata.EntryPoint]:
        assert select == {"group": cli_plugins.GROUP}
        return list(eps)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(args))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def test_the_installed_lab_gives_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "lab", "--help")  # the dev venv has the lab (scripts/setup.sh)
    assert code == 0
    for command in ("up", "down", "status"):
        assert command in out


@pytest.mark.parametrize("args", [("lab",), ("lab", "up", "--extra", "2"), ("lab", "--help")])
def test_a_missing_group_says_which_package_to_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        args: tuple[str, ...]) -> None:
    _only(monkeypatch)
    code, out, err = _run(capsys, *args)
    assert code == 2
    assert err == ("error: `ddtree-deploy lab` is unavailable: it is not installed "
                   "(install the ddtree-deploy-lab package)\n")
    assert out == ""


def test_a_broken_group_says_why_and_the_others_still_work(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _only(monkeypatch, importlib.metadata.EntryPoint(
        "lab", "ddtree_no_such_module_here:app", cli_plugins.GROUP))
    code, _, err = _run(capsys, "lab", "status")
    assert code == 2
    assert "`ddtree-deploy lab` is unavailable: it cannot be loaded from " \
           "ddtree_no_such_module_here:app: No module named 'ddtree_no_such_module_here'" in err
    assert _run(capsys, "hosts", "--help")[0] == 0


def test_any_distribution_can_add_a_group(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ddt_extra_plugin.py").write_text(textwrap.dedent("""
        import typer
        app = typer.Typer(help="An extra group.")
        @app.command()
        def hello(name: str) -> None:
            print(f"hello {name}")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    _only(monkeypatch, importlib.metadata.EntryPoint("extra", "ddt_extra_plugin:app",
                                                     cli_plugins.GROUP))
    assert _run(capsys, "extra", "hello", "there")[:2] == (0, "hello there\n")
    assert _run(capsys, "lab")[0] == 2  # the lab is still expected, and missing here


def test_a_group_named_like_a_built_in_command_does_not_shadow_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run imports only the built-in it names: a plugin of the same name would be listed in
    the help but never run, so it is not added at all."""
    (tmp_path / "ddt_shadow_plugin.py").write_text(textwrap.dedent("""
        import typer
        app = typer.Typer(help="A plugin that wants the hosts name.")
        @app.command()
        def hijack() -> None:
            print("plugin ran")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    _only(monkeypatch, importlib.metadata.EntryPoint("hosts", "ddt_shadow_plugin:app",
                                                     cli_plugins.GROUP))
    code, out, _ = _run(capsys, "--help")
    assert code == 0 and "A plugin that wants the hosts name" not in out
    code, out, err = _run(capsys, "hosts", "hijack")
    assert code == 2 and "plugin ran" not in out  # the built-in hosts group has no such command
    code, out, _ = _run(capsys, "hosts", "--help")
    assert code == 0 and "hijack" not in out
