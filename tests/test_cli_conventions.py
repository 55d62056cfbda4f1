"""Conventions a user of other CLIs expects (issue 31): -h, a typo'd subcommand said as one,
--version with the commit, the package's bounds, LICENSE and CHANGELOG."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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


@pytest.mark.integration  # git runs to read the commit
def test_version_names_the_commit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--version")
    assert code == 0
    assert re.fullmatch(rf"ddtree-deploy {re.escape(__version__)} \(commit [0-9a-f]{{12}}"
                        r"(\+dirty)?\)\n", out), out


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
