"""Conventions a user of other CLIs expects (issue 31): -h, a typo'd subcommand said as one,
--version with the commit, the package's bounds, LICENSE and CHANGELOG."""

from __future__ import annotations

import io
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy import __version__
from ddtree_deploy.cli import app as cli

ROOT = Path(__file__).resolve().parents[1]


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(args))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


@pytest.mark.parametrize("args", [(), ("service",), ("service", "up"), ("bench",),
                                  ("bench", "report"), ("plan",), ("overlay",)])
def test_dash_h_is_help_everywhere(capsys: pytest.CaptureFixture[str],
                                   args: tuple[str, ...]) -> None:
    code, out, err = _run(capsys, *args, "-h")
    assert code == 0, err
    assert "Usage:" in out and re.search(r"--help +-h ", out), out


@pytest.mark.parametrize(("typo", "meant"), [("reprot", "report"), ("recomend", "recommend")])
def test_a_typod_bench_subcommand_is_no_such_command(
        capsys: pytest.CaptureFixture[str], typo: str, meant: str) -> None:
    code, _, err = _run(capsys, "bench", typo)
    err = " ".join(re.sub("[│╭╮╰╯─]", " ", err).split())  # the panel's folding undone
    assert code == 2
    assert f"No such command '{typo}'" in err and f"Did you mean '{meant}'" in err
    assert "unknown host" not in err and f"bench run {typo}" in err


def test_a_host_name_far_from_any_subcommand_is_still_benched(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "--hosts", str(ROOT / "hosts.yaml"), "bench", "nosuchhost")
    assert code == 2
    assert "unknown host 'nosuchhost'" in err


@pytest.mark.integration  # git runs to say what HEAD is
def test_version_names_the_commit(capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    code, out, _ = _run(capsys, "--version")
    assert code == 0
    assert out == f"ddtree-deploy {__version__} (commit {head})\n"


def test_version_of_a_built_wheel_reads_its_commit(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_deploy import version

    built = tmp_path / "COMMIT"
    built.write_text("0123456789ab\n")
    monkeypatch.setattr(version, "_CHECKOUT", tmp_path)  # no .git: an installed wheel
    monkeypatch.setattr(version, "BUILT_COMMIT", built)
    assert version.version_line() == f"ddtree-deploy {__version__} (commit 0123456789ab)"
    built.write_text("\x1b[31m\n")  # never a control character on the terminal
    assert version.commit() == "unknown"
    built.unlink()
    assert version.commit() == "unknown"


def test_version_reads_a_worktrees_packed_ref(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_deploy import version

    main_git = tmp_path / "main" / ".git"
    (main_git / "worktrees" / "wt").mkdir(parents=True)
    (main_git / "packed-refs").write_text(f"# pack-refs\n{'ab' * 20} refs/heads/topic\n")
    wt_git = main_git / "worktrees" / "wt"
    (wt_git / "HEAD").write_text("ref: refs/heads/topic\n")
    (wt_git / "commondir").write_text("../..\n")
    checkout = tmp_path / "wt"
    checkout.mkdir()
    (checkout / ".git").write_text(f"gitdir: {wt_git}\n")
    monkeypatch.setattr(version, "_CHECKOUT", checkout)
    assert version.commit() == "ab" * 6
    (wt_git / "HEAD").write_text("cd" * 20 + "\n")  # detached
    assert version.commit() == "cd" * 6


def test_typer_and_rich_are_bounded_in_pyproject() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name in ("typer", "rich"):
        (spec,) = [d for d in deps if re.match(rf"{name}\b", d)]
        assert re.search(r",\s*<\d", spec), f"{spec}: no upper bound"


def test_license_and_changelog_exist() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "MIT"
    assert "**breaking**" in (ROOT / "CHANGELOG.md").read_text()


# ---- tables: plain rows off a terminal, --wide on one ---------------------------------------

LONG = "/srv/very/long/folder/names/of/a/shared/gpu/host/venvs/sglang-ddtree-cu130-py311"
FINGERPRINT = "SHA256:Zx0Yq2Vb7CwT9mK4sR1uLp8eN3jH6fG5dA0oI2kQwEr"


def _table() -> Any:
    from ddtree_deploy.cli.render_table import add_row, make_table

    table = make_table("venvs [bold]x[/bold]", ("host", "venv", "key", "notes"))
    add_row(table, "ct200", LONG, FINGERPRINT, "line one\nline\ttwo")
    add_row(table, "ct129", "/root/ml-env", "", "\x1b[2J")
    return table


def _console(terminal: bool, width: int = 80) -> tuple[Any, io.StringIO]:
    from rich.console import Console

    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=width, color_system=None), buf


def test_a_table_off_a_terminal_is_plain_rows() -> None:
    from ddtree_deploy.cli.render_table import show

    con, buf = _console(terminal=False)
    show(con, _table())
    assert buf.getvalue().splitlines() == [
        "# venvs [bold]x[/bold]",
        "# host\tvenv\tkey\tnotes",
        f"ct200\t{LONG}\t{FINGERPRINT}\tline one; line two",
        "ct129\t/root/ml-env\t\t\\x1b[2J",
    ]


def test_a_table_on_a_terminal_folds_and_wide_does_not() -> None:
    from ddtree_deploy.cli.render_table import show

    con, buf = _console(terminal=True)
    show(con, _table())
    folded = buf.getvalue()
    assert all(len(line) <= 80 for line in folded.splitlines())
    assert LONG not in folded  # folded at 80 columns: the reason for --wide
    con, buf = _console(terminal=True)
    show(con, _table(), wide=True)
    wide = buf.getvalue()
    assert LONG in wide and FINGERPRINT in wide and "…" not in wide


def test_hosts_list_piped_is_plain_rows(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--hosts", str(ROOT / "examples" / "hosts.story.yaml"),
                        "hosts", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[1] == "# host\ttarget\tuser\tGPUs expected\tvenvs"
    assert not any(c in out for c in "│┃━")
    rows = [line.split("\t") for line in lines if not line.startswith("#")]
    assert rows and all(len(r) in (5, 7) for r in rows)


# ---- JSON: one shape for every failure under --json ------------------------------------------

ERROR_KEYS = {"message", "hint", "file", "line"}


@pytest.mark.parametrize("args", [("plan", "--json", "--bogus"), ("service", "status", "--json"),
                                  ("inventory", "--json", "--concurrency", "zero")])
def test_a_usage_error_under_json_is_the_error_document(capsys: pytest.CaptureFixture[str],
                                                        args: tuple[str, ...]) -> None:
    code, out, err = _run(capsys, "--hosts", str(ROOT / "hosts.yaml"), *args)
    assert code == 2
    doc = json.loads(out)
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["schema"] == 1
    assert set(doc["error"]) == ERROR_KEYS and doc["error"]["message"]
    assert doc["error"]["hint"].startswith("Try 'ddtree-deploy ")
    assert "Usage:" in err  # a person still gets typer's message


def test_a_usage_error_without_json_prints_nothing_on_stdout(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "plan", "--bogus")
    assert code == 2 and out == ""


def test_a_config_error_under_json_names_file_and_line(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("version: 1\nhosts:\n  x:\n    address: 1.2.3.4\n    port: 70000\n")
    code, out, _ = _run(capsys, "--hosts", str(hosts), "plan", "--json")
    assert code == 2
    doc = json.loads(out)
    assert doc["error"]["file"] == str(hosts) and doc["error"]["line"] == 5
    assert "port" in doc["error"]["message"]


def test_a_hint_is_its_own_field() -> None:
    from ddtree_deploy.cli import errdoc
    from ddtree_deploy.errors import RefusedError

    doc = errdoc.of_error(RefusedError("GPU 0 is busy", hint="pass --force"), 1)
    assert doc == {"ok": False, "error": {"message": "GPU 0 is busy", "hint": "pass --force",
                                          "file": None, "line": None},
                   "exit_code": 1, "schema": 1}


# ---- help: every parameter explained, labels that say what to type, one line per command -----


def _tree() -> list[tuple[str, Any]]:
    import typer

    from ddtree_deploy.cli.helptext import prepare

    root = typer.main.get_command(cli.build_app())
    prepare(root)
    found: list[tuple[str, Any]] = []

    def walk(command: Any, path: str) -> None:
        found.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(root, "")
    return found


def test_every_parameter_has_help_and_a_label_not_a_python_type() -> None:
    missing, typed = [], []
    for path, command in _tree():
        for param in command.params:
            if not param.help:
                missing.append(f"{path} {param.name}")
            if param.param_type_name == "option" and param.metavar is None \
                    and not getattr(param.type_descriptor, "is_choice", False):
                typed.append(f"{path} {param.opts[0]}")
    assert missing == [] and typed == [], (missing, typed)


def test_a_flag_has_no_type_label(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "apply", "-h")
    assert code == 0
    for line in out.splitlines():
        if "--yes" in line or "--help" in line:
            assert "<bool>" not in line, line
    assert "<int" not in out and "<float" not in out and "<path>" not in out


def test_command_lists_are_one_sentence_per_command() -> None:
    for path, command in _tree():
        for name, sub in getattr(command, "commands", {}).items():
            line = sub.short_help or ""
            assert line and "\n" not in line and "…" not in line, (path, name, line)
            assert line == " ".join(line.split())


def _stand_in(command: Any) -> bool:
    """cli_plugins' command for a plugin that is not installed (no help of its own)."""
    return getattr(command.callback, "__name__", "") == "unavailable"


def test_every_command_has_an_example_that_parses() -> None:
    import shlex

    from ddtree_deploy.cli.helptext import EXAMPLE_MAX, EXAMPLES, example_of

    tree = dict(_tree())
    for path, command in tree.items():
        if _stand_in(command):
            continue  # a plugin that is not installed here: it says so when run
        if path.split(" ")[0] in cli.BUILT_INS or not path:
            assert path in EXAMPLES, f"no example for '{path}'"
        example = example_of(command)  # a plugin's group brings its own
        assert example, f"no example for '{path}'"
        assert len(example) <= EXAMPLE_MAX, example  # one line on an 80-column terminal
        words = shlex.split(example.split("|")[0])
        assert words[0] == "ddtree-deploy"
        words = words[1:]
        while words and words[0].startswith("--hosts"):
            words = words[2:]
        leaf, rest = path, words[len(path.split()) if path else 0:]
        assert words[: len(path.split()) if path else 0] == (path.split() if path else []), \
            example
        target = tree[leaf]
        if hasattr(target, "commands") and rest and rest[0] in target.commands:
            target, rest = target.commands[rest[0]], rest[1:]
        if hasattr(target, "commands") and not rest:
            continue
        if leaf == "bench" and rest and rest[0] not in target.commands:
            target = target.commands["run"]  # `bench HOST ...` is `bench run HOST ...`
        ctx = target.make_context(leaf or "ddtree-deploy", list(rest))  # raises when wrong
        assert ctx is not None


def _columns(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    from typer import rich_utils

    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(rich_utils, "MAX_WIDTH", width)  # read from TERMINAL_WIDTH at import


def _help_page(capsys: pytest.CaptureFixture[str], path: str) -> str:
    code, out, err = _run(capsys, *path.split(), "-h")
    assert code == 0, (path, err)
    return out


# What typer shows when a label is left to it: a Python type, braces round a required
# argument, a default or a word cut with an ellipsis.
LEFTOVERS = re.compile(r"<(str|bool|int|float|path|list\[\w+\]|[a-z]+ range)>|\{[A-Z_]+\}|…")


def test_every_help_page_reads_clean_on_an_80_column_terminal(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _columns(monkeypatch, 80)
    from ddtree_deploy.cli.helptext import example_of

    pages = 0
    for path, command in _tree():
        if _stand_in(command):
            continue
        out = _help_page(capsys, path)
        lines = out.splitlines()
        assert all(len(line) <= 80 for line in lines), path
        bad = [line for line in lines if LEFTOVERS.search(line)]
        assert bad == [], (path, bad)
        example = example_of(command)
        assert example and any(line.strip() == example for line in lines), (path, example)
        pages += 1
    assert pages >= 30  # every command, not a few


@pytest.mark.parametrize("width", [80, 60, None], ids=["80", "60", "not-a-terminal"])
def test_every_option_name_is_shown_whole_at_common_widths(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        width: int | None) -> None:
    """Every command's help names each of its options whole (rich cut them with "…" where a
    name and the columns beside it did not fit: 60 columns, `--mem-fraction-static`), and
    cuts no word of its help either. None: no $COLUMNS, written to a pipe."""
    if width is None:
        from typer import rich_utils

        monkeypatch.delenv("COLUMNS", raising=False)
        monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
        monkeypatch.setattr(rich_utils, "MAX_WIDTH", None)
    else:
        _columns(monkeypatch, width)
    names = 0
    for path, command in _tree():
        if _stand_in(command):
            continue
        out = _help_page(capsys, path)
        assert "…" not in out, (path, [ln for ln in out.splitlines() if "…" in ln])
        for param in command.params:
            if param.param_type_name != "option" or param.hidden:
                continue
            for name in (*param.opts, *param.secondary_opts):
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", out), (path, name)
                names += 1
    assert names >= 120  # every option of every command, not a few


def test_usage_names_arguments_in_capitals_without_braces(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert "Usage: ddtree-deploy venv clone [OPTIONS] HOST SRC DST" in _help_page(
        capsys, "venv clone")
    assert "Usage: ddtree-deploy plan [OPTIONS] [HOSTS]..." in _help_page(capsys, "plan")
    out = _help_page(capsys, "service up")
    assert "Usage: ddtree-deploy service up [OPTIONS] HOST [NAME]" in out
    assert re.search(r"--venv +PATH ", out)
    assert re.search(r"--algorithm +none\|dflash\|ddtree ", out)


def test_a_comma_separated_default_is_wrapped_not_cut(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _columns(monkeypatch, 80)
    out = " ".join(re.sub("[│╭╮╰╯─]", " ", _help_page(capsys, "bench run")).split())
    assert "[default: none, dflash, ddtree:15/8, ddtree:31/8]" in out
    assert re.search(r"--configs CONFIG,\.\.\. ", out)
    assert re.search(r"--concurrency N,\.\.\. ", out)


@pytest.mark.parametrize(("given", "parsed"), [
    (["plan", "ct200", "--hosts", "f.yaml"], ["--hosts", "f.yaml", "plan", "ct200"]),
    (["service", "up", "h", "--hosts=f.yaml", "--lab"],
     ["--hosts=f.yaml", "--lab", "service", "up", "h"]),
    (["--hosts", "plan", "plan"], ["--hosts", "plan", "plan"]),  # a file named plan
    (["bench", "h", "--", "--hosts", "x"], ["bench", "h", "--", "--hosts", "x"]),
    (["lab", "up", "--hosts", "x"], ["lab", "up", "--hosts", "x"]),  # a plugin parses its own
])
def test_root_options_work_after_the_command(given: list[str], parsed: list[str]) -> None:
    assert cli.root_options_first(given) == parsed


def test_hosts_after_the_command_is_the_hosts_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "hosts", "list", "--hosts",
                        str(ROOT / "examples" / "hosts.story.yaml"))
    assert code == 0 and "hosts.story.yaml" in out


def test_debug_adds_the_traceback_and_not_otherwise(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    missing = str(tmp_path / "none.yaml")
    code, _, err = _run(capsys, "--hosts", missing, "plan")
    assert code == 2 and "Traceback" not in err and "does not exist" in err
    code, _, err = _run(capsys, "plan", "--hosts", missing, "--debug")
    assert code == 2 and "Traceback (most recent call last)" in err
    assert "ConfigError" in err and err.rstrip().endswith("does not exist (from --hosts "
                                                          f"{missing})")


def test_shell_completion_is_offered(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "-h")
    assert code == 0 and "--install-completion" in out and "--show-completion" in out


def test_an_argument_with_its_own_metavar_has_no_braces_either() -> None:
    """A command (a plugin's) may name its argument: the name is kept, typer's braces and
    type are not."""
    import typer
    from typer import _click as click

    from ddtree_deploy.cli.helptext import prepare

    app = typer.Typer()

    @app.command()
    def show(path: str = typer.Argument(..., metavar="FILE", help="a file"),
             more: list[str] = typer.Argument(None, help="more")) -> None:
        """Show it."""

    command = typer.main.get_command(app)
    prepare(command)
    with click.Context(command) as ctx:
        usage = " ".join(command.collect_usage_pieces(ctx))
        assert usage == "[OPTIONS] FILE [MORE]...", usage
        assert all(p.display_type_rich(ctx) is None for p in command.params
                   if p.param_type_name == "argument")
    prepare(command)  # twice (docs and tests build the tree again): the same
    with click.Context(command) as ctx:
        assert " ".join(command.collect_usage_pieces(ctx)) == "[OPTIONS] FILE [MORE]..."
