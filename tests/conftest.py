# ruff: noqa: E402  (the imports come after HOME and XDG are set, below the docstring)
"""Shared fixtures: the lab (brought up once per session, taken down at the end).

Before anything imports the tool, the session's HOME and XDG folders are folders of the
checkout's own, under the git-ignored .test-home/ (the tool's caches, state and config, uv's
and pip's caches, the lab's root file system and keys): no test writes under the real HOME.
Subprocesses inherit them; a test that gives a child a made-up environment gives it these (or
folders of its own). They persist between runs (caches); scripts/fresh-run.sh starts from none.
"""

from __future__ import annotations

import os
from pathlib import Path

TEST_HOME = Path(__file__).resolve().parent.parent / ".test-home"
HOME_VARS = {"HOME": "", "XDG_CACHE_HOME": ".cache", "XDG_CONFIG_HOME": ".config",
             "XDG_STATE_HOME": ".local/state", "XDG_DATA_HOME": ".local/share"}
for _var, _sub in HOME_VARS.items():
    (TEST_HOME / _sub).mkdir(parents=True, exist_ok=True)
    os.environ[_var] = str(TEST_HOME / _sub)

import importlib.machinery
import shutil
import socket
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator

import pytest
import tiers
from sshd_fixture import Sshd, sshd_available

from ddtree_deploy.config.hosts import Config, load_config
from ddtree_deploy.resources import embedded_hosts_file

# -- tiers (tests/tiers.py): unit, integration, lab -------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--tier-manifest", metavar="FILE",
                     help="write each selected test's tier and id to FILE (scripts/test.sh)")
    parser.addoption("--skip-report", metavar="FILE",
                     help="append each skipped test's id and reason to FILE (scripts/test.sh "
                          "lists them at the end)")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the tier markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.mark(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    manifest = session.config.getoption("--tier-manifest")
    if manifest and collects_for_the_run(session.config):
        tiers.write_manifest(manifest, session.items)


# Under pytest-xdist (scripts/test.sh runs the unit and integration tiers with -n) the
# controller collects nothing and every worker collects the same items (xdist checks that they
# agree): the first worker writes the manifest. Each report reaches the controller as well as
# the worker that ran the test: the controller alone lists the skips.
def _worker(config: pytest.Config) -> str | None:
    return getattr(config, "workerinput", {}).get("workerid")


def collects_for_the_run(config: pytest.Config) -> bool:
    """Whether this process's collection is the run's: a plain run, or xdist's first worker."""
    worker = _worker(config)
    if worker is None:
        return not config.pluginmanager.has_plugin("dsession")  # xdist's controller
    return worker == "gw0"


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in (("unit", "pure: no sshd, venvs, real wheels, compiler, subprocess "
                                "servers or lab"),
                       ("integration", "sshd, venvs, real wheels, compiled stand-ins, "
                                       "subprocess servers"),
                       ("lab", "the systemd-nspawn lab and its machinery")):
        config.addinivalue_line("markers", f"{tier}: tier ({what}); set by tests/tiers.py")
    config.stash[_GUARD] = tiers.UnitGuard()
    # matplotlib builds its font cache on first use, and with the system's fonts that runs
    # fc-list (a process: refused in the unit tier) whenever its cache folder is empty, as on a
    # new machine. The session gives it a folder of its own and its bundled fonts only (the
    # subprocesses the tests start inherit both).
    config.stash[_MPL] = tempfile.mkdtemp(prefix="ddt-mpl-")
    os.environ["MPLCONFIGDIR"] = config.stash[_MPL]
    os.environ["MPL_IGNORE_SYSTEM_FONTS"] = "1"
    report = config.getoption("--skip-report", None)
    if report and _worker(config) is None:
        config.pluginmanager.register(SkipReport(Path(report)), "skip-report")
    if _worker(config) is not None:
        config.pluginmanager.register(PortableWarnings(), "portable-warnings")


class SkipReport:
    """Appends "id<TAB>reason" for each skipped test (in setup or call) to a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.skipped or report.when == "teardown":
            return
        longrepr = report.longrepr  # (file, line, reason); a list once it came from a worker
        reason = longrepr[2] if isinstance(longrepr, tuple | list) else str(longrepr)
        reason = reason.removeprefix("Skipped: ").replace("\n", " ")
        with self.path.open("a") as f:
            f.write(f"{report.nodeid}\t{reason}\n")


class PortableWarnings:
    """On an xdist worker: a warning whose class the controller cannot import travels as a
    plain Warning that names the class. The controller rebuilds each warning a worker records by
    importing its class's module, and a module a test put on sys.path itself (FastAPI's, from
    its wheel, under SGLang's real handlers: tests/test_plugin_http_admission.py) is not there:
    xdist would stop the whole run with an internal error."""

    def __init__(self) -> None:
        self.path = list(sys.path)  # as the controller's: before any test module is imported

    def _importable(self, cls: type) -> bool:
        top = cls.__module__.partition(".")[0]
        return top in sys.builtin_module_names or (
            importlib.machinery.PathFinder.find_spec(top, self.path) is not None)

    @pytest.hookimpl(tryfirst=True)  # before xdist's own hook sends it to the controller
    def pytest_warning_recorded(self, warning_message: warnings.WarningMessage) -> None:
        message, category = warning_message.message, warning_message.category
        if self._importable(type(message)) and self._importable(category):
            return
        warning_message.message = Warning(f"{category.__module__}.{category.__name__}: {message}")
        warning_message.category = Warning


_GUARD = pytest.StashKey["tiers.UnitGuard"]()
_MPL = pytest.StashKey[str]()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _MPL in config.stash:
        shutil.rmtree(config.stash[_MPL], ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    guard = item.config.stash[_GUARD]
    guard.current = [] if item.stash.get(tiers.TIER, None) == "unit" else None
    try:
        yield
    finally:
        guard.current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    guard = item.config.stash[_GUARD]
    if guard.current and report.when in ("setup", "call") and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"a unit test started {', '.join(sorted(set(guard.current)))}: "
                           "unit tests start no process (tests/tiers.py: a fixture, marker or "
                           "module entry puts it in integration)")
    if guard.current is not None:
        guard.current.clear()
    if report.skipped and report.when in ("setup", "call") and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        refused = tiers.ci_skip_refused(reason.removeprefix("Skipped: "),
                                        bool(os.environ.get("CI")))
        if refused:
            report.outcome = "failed"
            report.longrepr = refused


def lab_possible() -> str | None:
    """Why the lab cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the lab needs root"
    for tool in ("systemd-nspawn", "debootstrap", "ip", "ssh-keygen", "gcc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run scripts/setup.sh)"
    return None


@pytest.fixture(scope="session", autouse=True)
def kept_connections_end() -> Iterator[None]:
    """The OpenSSH masters the tool keeps for facts (ssh_persist) live in a control folder of
    this session's own (so another run's are never touched), ended with the session."""

    from ddtree_deploy.transport import openssh

    runtime = tempfile.mkdtemp(prefix="ddt-rt-", dir="/tmp")  # short: socket paths are limited
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = runtime
    try:
        yield
    finally:
        if openssh.available():
            openssh.disconnect_all()
        if old is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = old
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture(scope="session")
def lab_session() -> Iterator[None]:
    reason = lab_possible()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"lab tests must run in CI: {reason}")
        pytest.skip(reason)
    from ddtree_lab import lock, manager

    # The whole session holds the lab: another `lab up` (a benchmark, a second session) waits
    # for it or is refused naming this process, instead of tearing these containers down.
    with lock.session():
        manager.up()
        try:
            yield
        finally:
            manager.down()


@pytest.fixture()
def lab(lab_session: None) -> Config:
    """The lab is up (brought back if a test took it down); returns the embedded hosts file."""
    from ddtree_lab import manager

    rows = manager.status()
    if not rows or not all(r.running and r.ssh for r in rows):
        manager.up()
    config = load_config(embedded_hosts_file())
    _models_in_place(config)
    return config


# Once, a CI run found ct129's /dev/shm model folder gone (cause not found; no code here or in
# the tool removes it). The lab copies these folders at boot; a test must find them there.
_RESTORE_MODELS = """
for m in "$@"; do [ -f "$m/config.json" ] && continue
  echo "missing: $m"; journalctl -b --no-pager -n 30 2>&1 | tail -30
  systemd-tmpfiles --create --prefix=/dev/shm >/dev/null 2>&1 || true
done
"""


def _models_in_place(config: Config) -> None:
    import warnings

    from ddtree_deploy.transport import Command
    from ddtree_deploy.transport.connect import open_transport

    for host in config.hosts.values():
        models = sorted({str(p) for p in host.models.values() if str(p).startswith("/dev/shm/")})
        if not models:
            continue
        with open_transport(config, host) as t:
            r = t.run(Command.shell(_RESTORE_MODELS, *models), timeout=30)
        if r.stdout.strip():
            warnings.warn(f"lab: {host.name} lost its model folders; put back. {r.stdout}",
                          stacklevel=1)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH sshd on loopback for one test module, stopped by its PID after it."""
    reason = sshd_available()
    if reason:
        if os.environ.get("CI"):  # as the lab: in CI a missing sshd is a failure, not a skip
            pytest.fail(f"sshd tests must run in CI: {reason}")
        pytest.skip(reason)
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def openssh_control(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private OpenSSH control folder per test (short: socket paths are limited); the masters
    kept there are ended and the folder removed after the test."""
    from ddtree_deploy.transport import openssh

    runtime = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    yield runtime
    openssh.disconnect_all()
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture()
def mute_port() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback port that accepts and never sends a byte; the connections it took."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    taken: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            taken.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], taken
    finally:
        server.close()
        for conn in taken:
            conn.close()
