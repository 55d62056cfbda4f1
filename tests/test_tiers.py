"""The tiers (tests/tiers.py): a test's tier from what it uses, refused when its markers
contradict it; the unit guard names the program a unit test started."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import conftest
import pytest
import tiers


def sshd() -> None:  # a fixture function of the same name as conftest's, defined in this file
    pass


def _item(module: str = "test_x.py", fixtures: dict[str, Callable[..., Any]] | None = None,
          markers: tuple[str, ...] = (), function: str = "test_it", case: str = "") -> Any:
    fixtures = fixtures or {}
    marks = [getattr(pytest.mark, m).mark for m in markers]
    return SimpleNamespace(
        nodeid=f"tests/{module}::{function}{case}", path=Path("tests") / module,
        name=function + case, originalname=function,
        fixturenames=list(fixtures),
        _fixtureinfo=SimpleNamespace(
            name2fixturedefs={n: [SimpleNamespace(func=f)] for n, f in fixtures.items()}),
        iter_markers=lambda: iter(marks))


CONFTEST = conftest.lab_possible  # any function defined in tests/conftest.py


def test_a_test_using_nothing_heavy_is_a_unit_test() -> None:
    assert tiers.tier_of(_item(fixtures={"tmp_path": lambda: None})) == "unit"


def test_fixtures_markers_and_modules_give_the_heavier_tiers() -> None:
    assert tiers.tier_of(_item(fixtures={"sshd": CONFTEST})) == "integration"
    assert tiers.tier_of(_item(markers=("slow",))) == "integration"
    assert tiers.tier_of(_item(fixtures={"lab_session": CONFTEST, "sshd": CONFTEST})) == "lab"
    assert tiers.tier_of(_item(module="test_lab_guard.py")) == "lab"
    assert tiers.tier_of(_item(module="test_installer.py")) == "integration"
    one = ("test_units.py", "test_verify_fails_on_a_bad_directive")  # in INTEGRATION_TESTS
    assert tiers.tier_of(_item(module=one[0], function=one[1], case="[x]")) == "integration"
    assert tiers.tier_of(_item(module=one[0], function="test_other")) == "unit"


def test_a_fixture_is_known_by_the_file_that_defines_it() -> None:
    assert tiers.tier_of(_item(fixtures={"sshd": sshd})) == "unit"


def test_a_tier_marker_may_only_make_a_test_heavier() -> None:
    assert tiers.tier_of(_item(markers=("integration",))) == "integration"
    with pytest.raises(pytest.UsageError, match=r"marked unit, but what it uses puts it in "
                                                r"integration"):
        tiers.tier_of(_item(fixtures={"sshd": CONFTEST}, markers=("unit",)))
    with pytest.raises(pytest.UsageError, match="in two tiers"):
        tiers.tier_of(_item(markers=("unit", "lab")))


def test_this_test_is_marked_unit(request: pytest.FixtureRequest) -> None:
    marks = {m.name for m in request.node.iter_markers()} & set(tiers.TIERS)
    assert marks == {"unit"}


@pytest.mark.parametrize(("argv", "named"), [
    (["/usr/sbin/sshd", "-D", "-f", "cfg"], "sshd"),
    (["/v/bin/python3", "-m", "venv", "/tmp/v"], "python3 -m venv"),
    (["/v/bin/python", "-I", "-m", "pip", "download", "x"], "python -m pip"),
    ([b"/usr/bin/gcc", b"-shared"], "gcc"),
    ("ssh -O exit host", "ssh"),
    (["/bin/sh", "-c", "true"], "sh"),
    ([], None),
])
def test_the_unit_guard_names_the_program(argv: Any, named: str | None) -> None:
    assert tiers.UnitGuard._what(argv) == named


@pytest.mark.integration  # it starts processes on purpose (a unit test's guard would refuse it)
def test_the_unit_guard_sees_os_system_and_forks() -> None:
    import os

    guard = tiers.UnitGuard()
    guard.current = []
    try:
        assert os.system("true") == 0
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    finally:
        seen, guard.current = guard.current, None
    assert seen == ["true", "a fork"]


def test_matplotlibs_font_cache_is_built_without_a_process() -> None:
    """On a new machine matplotlib's cache folder is empty and building it ran fc-list, which
    the unit guard refuses: the session gives matplotlib a folder of its own and its own fonts."""
    from matplotlib import font_manager

    assert os.environ["MPLCONFIGDIR"].startswith(tempfile.gettempdir())
    manager = font_manager._load_fontmanager(try_read_cache=False)  # as with an empty cache
    assert manager.ttflist and all(f.fname.startswith(os.path.dirname(font_manager.__file__))
                                   for f in manager.ttflist)


@pytest.mark.parametrize(("reason", "ci", "refused"), [
    ("needs a CUDA GPU", True, False),
    ("this machine has libcuda.so.1", True, False),
    ("no sock_diag netlink here", True, False),
    ("zstd is needed on the source", True, True),
    (".test-wheels/x-1-py3-none-any.whl is not fetched", True, True),
    ("zstd is needed on the source", False, False),
])
def test_in_ci_only_what_the_machine_cannot_have_may_skip(reason: str, ci: bool,
                                                          refused: bool) -> None:
    said = tiers.ci_skip_refused(reason, ci)
    assert (said is not None) == refused
    if said:
        assert said.startswith(f"skipped in CI: {reason} (")


SUITE = '''
import sys
import warnings

import pytest

@pytest.mark.parametrize("n", range(5))
def test_pure(n):
    assert n >= 0

@pytest.mark.integration
def test_heavier():
    pass

def test_skipped():
    pytest.skip("needs a CUDA GPU")

def test_warns_with_a_class_from_a_path_of_its_own(tmp_path):
    (tmp_path / "faraway.py").write_text("class FarWarning(DeprecationWarning):\\n    pass\\n")
    sys.path.insert(0, str(tmp_path))
    import faraway
    warnings.warn(faraway.FarWarning("said far away"), stacklevel=1)
'''


@pytest.mark.integration  # it runs pytest, and pytest-xdist's workers, as processes
@pytest.mark.parametrize("workers", ["0", "3"])
def test_the_manifest_and_skip_report_are_whole_under_xdist(tmp_path: Path, workers: str) -> None:
    """scripts/test.sh runs tiers with pytest-xdist (-n): the manifest lists each selected test
    once with its tier, the skip report each skip once (not once per process), and a warning
    whose class only the worker can import is reported, not an internal error of xdist."""
    import subprocess
    import sys

    (tmp_path / "test_suite.py").write_text(SUITE)
    manifest, skips = tmp_path / "manifest", tmp_path / "skips"
    env = {**os.environ, "PYTHONPATH": str(Path(conftest.__file__).parent)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p",
                          "no:cacheprovider", "-q", "-n", workers, f"--tier-manifest={manifest}",
                          f"--skip-report={skips}", "test_suite.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "7 passed, 1 skipped, 1 warning" in run.stdout
    assert "FarWarning: said far away" in run.stdout
    assert sorted(manifest.read_text().splitlines()) == sorted(
        [f"unit test_suite.py::test_pure[{n}]" for n in range(5)]
        + ["integration test_suite.py::test_heavier", "unit test_suite.py::test_skipped",
           "unit test_suite.py::test_warns_with_a_class_from_a_path_of_its_own"])
    assert skips.read_text() == "test_suite.py::test_skipped\tneeds a CUDA GPU\n"
