"""Every command's --json path prints ONE document of one shape (docs/json.md,
tests/json_envelope.py): `{"ok": true, "results", "exit_code", "schema": 1}` when it did its
work, `{"ok": false, "error": {message, hint, file, line}, "exit_code", "schema": 1}` when it
stopped; `exit_code` is the process's, and no time in it is an epoch number.

The CLI runs in this process (main(): exit codes and error rendering as a user gets them);
what would reach a host is replaced where the command calls it (open_transport, and the
functions that read or change the host), as tests/test_hostile_service_cli.py does, so the
command line and its rendering are what is tested. Before issue 31's JSON work a success
printed its payload bare (a list, a dict of the command's own), apply, hosts list/check,
service up/down/logs, venv clone and overlay rollback had no --json, and inventory's
`taken_at`, payload status' `deployed_at` were epoch numbers.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import golden
import pytest
from json_envelope import Failure, Success, check

from ddtree_deploy.cli import app
from ddtree_deploy.errors import RemoteCommandError, UnreachableError

ROOT = Path(__file__).resolve().parents[1]
STORY = ROOT / "examples" / "hosts.story.yaml"  # hosts ct129 and ct200, deployment sglang-ddtree
RECORDED = ROOT / "tests" / "data" / "bench" / "standin-sweep.json"
VENV = "/root/venv_sglang211"  # ct200's serving venv
EPOCH = 1764770645.25  # 2025-12-03T14:04:05.250+00:00
EPOCH_ISO = "2025-12-03T14:04:05.250+00:00"

Stubs = Callable[[pytest.MonkeyPatch, Path], None]


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.delenv("DDTREE_DEPLOY_HOSTS", raising=False)


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        app.main(["--hosts", str(STORY), *argv])
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.out, captured.err


# ---- the stand-ins -------------------------------------------------------------------------


def _host(mp: pytest.MonkeyPatch) -> None:
    """open_transport: a connection that is never used for real (each call it would carry
    is replaced by the row)."""

    @contextlib.contextmanager
    def fake_open(config: Any, spec: Any, **_: Any) -> Iterator[object]:
        yield SimpleNamespace(host=getattr(spec, "name", spec))

    mp.setattr("ddtree_deploy.transport.connect.open_transport", fake_open)


def _facts(host: str = "ct200") -> Any:
    from ddtree_deploy.facts.model import Facts

    data = golden.story_facts(True) if host == "ct200" else golden.generic_facts(host, [])
    return Facts.model_validate({**data, "taken_at": EPOCH})


def _outcomes(*hosts: str) -> Callable[..., list[Any]]:
    """facts.gather.collect: the story's facts for ct200, ct129 unreachable."""
    from ddtree_deploy.transport.fanout import Outcome

    def collect(config: Any, names: list[str], **_: Any) -> list[Any]:
        return [Outcome(h, value=_facts(h)) if h == "ct200" else
                Outcome(h, error=UnreachableError(f"{h}: unreachable (timed out)"))
                for h in names]

    return collect


def _units(mp: pytest.MonkeyPatch) -> None:
    from ddtree_deploy.service import install
    from ddtree_deploy.service.install import UnitState

    _host(mp)
    mp.setattr(install, "list_units", lambda t: [UnitState(
        unit="sglang-ddtree.service", active="active", sub="running", restarts=0,
        main_pid=42, exit_status=0, deployment="sglang-ddtree")])
    mp.setattr(install, "logs", lambda t, unit, lines=200: "one\n\x1b[31mtwo\n")
    mp.setattr(install, "down", lambda t, unit, remove=False: True)
    mp.setattr(install, "restart", lambda t, unit: None)


def _verdict(status: str = "healthy") -> Callable[..., Any]:
    from ddtree_deploy.health.verdict import Verdict

    return lambda *a, **kw: Verdict(status, "/health 200; greedy and sampled answered"  # type: ignore[arg-type]
                                    if status == "healthy" else "the server exited")


def _probe(status: str) -> Stubs:
    def stubs(mp: pytest.MonkeyPatch, tmp: Path) -> None:
        _units(mp)
        mp.setattr("ddtree_deploy.health.check.probe_service", _verdict(status))
    return stubs


def _service_facts(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    from ddtree_deploy.cli import service
    from ddtree_deploy.converge.steps import unit_install

    _units(mp)
    mp.setattr(service, "_facts", lambda config, spec, venvs, refresh: _facts())
    mp.setattr(unit_install, "install_unit",
               lambda t, spec, dep=None: (unit_install.unit_text(spec), True))
    mp.setattr("ddtree_deploy.health.check.probe_service", _verdict())


def _plan(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    from ddtree_deploy.converge import runner
    from ddtree_deploy.converge.steps import Plan, Step

    step = Step("package.install", "ct200", "sglang-ddtree", "soundfile==0.13.1",
                "not installed")
    mp.setattr(runner, "make_plan", lambda config, names, refresh: Plan(
        ["ct200"], [step], {"ct200": "48e3387fab5638d6"}, made_at=EPOCH,
        facts_at={"ct200": EPOCH - 60}))


def _apply(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    from ddtree_deploy.converge import runner
    from ddtree_deploy.converge.steps import Step

    def apply_host(config: Any, name: str, **kw: Any) -> Any:
        if name == "ct129":
            raise UnreachableError("ct129: unreachable (timed out)", hint="is it up?")
        done = [Step("package.install", name, "sglang-ddtree", "soundfile==0.13.1", "missing")]
        return runner.HostRun(name, done=done, verdict="healthy", log=kw.get("log"),
                              timings=[("package.install", "soundfile==0.13.1", 2.5)], total_s=3.0)

    mp.setattr(runner, "apply_host", apply_host)


def _inventory(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    mp.setattr("ddtree_deploy.cli.inventory.collect", _outcomes())


def _payload(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    from ddtree_deploy.payload import deploy as ops
    from ddtree_deploy.payload.outcome import Outcome, StepResult

    _host(mp)
    checks = [StepResult("spec_info", "import", "passed", '{"ddtree": true}')]
    mp.setattr(ops, "deploy", lambda t, venv, *a, **kw: Outcome(
        venv, "deployed", "0.5.11", "0.1.0", checks))
    mp.setattr(ops, "rollback", lambda t, venv, **kw: Outcome(venv, "rolled back", "0.5.11"))
    mp.setattr(ops, "installed", lambda t, venv, dist=None: ({"version": "0.5.11"}, None))
    mp.setattr(ops, "status", lambda t, venvs: {v: None for v in venvs} | {VENV: {
        "payload": "ddtree", "version": "0.1.0", "sglang": "0.5.11", "form": "patch",
        "backup": "/root/b", "deployed_at": EPOCH}})
    mp.setattr("ddtree_deploy.facts.gather.collect", _outcomes())


class _OverlayPlan:
    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {"lane": "cu130", "changes": [], "bytes_to_send": 0, "id": "abc"}


def _overlay(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    from ddtree_deploy.overlay import apply as remote_apply
    from ddtree_deploy.overlay import run, summary

    _host(mp)
    mp.setattr(run, "make_plan", lambda *a, **kw: (_OverlayPlan(), "/site"))
    mp.setattr(run, "run_fleet", lambda *a, **kw: SimpleNamespace(
        targets=[SimpleNamespace(host="ct200", result="applied")], failed=[]))
    mp.setattr(summary, "fleet_summary", lambda fleet, lane: {
        "lane": lane, "result": "applied", "target": {"host": "ct200", "venv": VENV},
        "bytes_fetched": 10, "bytes_pushed": 10, "checks": []})
    mp.setattr(remote_apply, "rollback", lambda t, venv, sudo=False: SimpleNamespace(
        result="rolled back", message="the backup of plan abc restored"))
    mp.setattr(remote_apply, "history", lambda t, venv, sudo=False: (
        [{"op": "apply", "result": "applied", "time": "2026-12-03T16:04:05+0100"}], None))


def _overlay_fails(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    from ddtree_deploy.overlay import apply as remote_apply

    def rollback(t: Any, venv: str, sudo: bool = False) -> Any:
        raise RemoteCommandError(f"ct200: overlay rollback of {venv}: no backup")

    _host(mp)
    mp.setattr(remote_apply, "rollback", rollback)


def _clone(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    _host(mp)
    mp.setattr("ddtree_deploy.converge.steps._venv_clone.clone",
               lambda t, src, dst: SimpleNamespace(fixed_scripts=["pip", "sglang"]))


def _hosts(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    from ddtree_deploy.hostcheck import GpuLine, HostCheck
    from ddtree_deploy.transport.hostscan import TrustResult

    def check_host(config: Any, spec: Any) -> HostCheck:
        if spec.name == "ct129":
            raise UnreachableError("ct129: unreachable (timed out)")
        return HostCheck(spec.name, "ct200", "6.8", [GpuLine("0", "H200", "1", "143771")],
                         venvs={VENV: True})

    mp.setattr("ddtree_deploy.hostcheck.check_host", check_host)
    mp.setattr("ddtree_deploy.transport.hostscan.trust_host", lambda *a, **kw: TrustResult(
        "added", "ct200", "ssh-ed25519", "SHA256:abc", tmp / "known_hosts"))
    mp.setattr("ddtree_deploy.transport.openssh.available", lambda: True)
    mp.setattr("ddtree_deploy.transport.connect.openssh_transport",
               lambda spec: SimpleNamespace(disconnect=lambda: spec.name == "ct200"))


def _lab(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    from ddtree_lab import manager

    mp.setattr(manager, "status", lambda: [
        manager.HostStatus("ct129", "10.0.0.129", True, True, 7),
        manager.HostStatus("ct200", "10.0.0.200", False, False, None)])


def _nothing(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    pass


# ---- the table: (argv, stand-ins, exit code, what the results hold) ------------------------


def _row(name: str, argv: list[str], stubs: Stubs, code: int, holds: Callable[[Any], Any],
         marks: Any = ()) -> Any:
    return pytest.param(name, argv, stubs, code, holds, id=name, marks=marks)


def _has(**fields: Any) -> Callable[[Any], None]:
    def check_(results: Any) -> None:
        for k, v in fields.items():
            assert results[k] == v, (k, results[k], v)
    return check_


def _per_host(**ok: bool) -> Callable[[Any], None]:
    """A multi-host command's results: one entry per host, in order; a failed host carries
    the error object of a failure's document."""
    def check_(results: Any) -> None:
        assert [r["host"] for r in results] == list(ok)
        for r in results:
            assert r["ok"] is ok[r["host"]], r
            if not r["ok"]:
                assert set(r) == {"host", "ok", "error", "exit_code"}
                assert "unreachable" in r["error"]["message"] and r["exit_code"] == 1
    return check_


SUCCESS: list[Any] = [
    _row("plan", ["plan", "ct200", "--json"], _plan, 4,
         _has(made_at=EPOCH_ISO, changes=1, facts_at={"ct200": "2025-12-03T14:03:05.250+00:00"})),
    _row("apply", ["apply", "ct129", "ct200", "--yes", "--json"], _apply, 3,
         _per_host(ct129=False, ct200=True)),
    _row("inventory", ["inventory", "ct129", "ct200", "--json"], _inventory, 3,
         _per_host(ct129=False, ct200=True)),
    _row("doctor", ["doctor", "ct200", "--venv", VENV, "--json"], _inventory, 1,  # findings
         lambda r: r["host"] == "ct200" and any(f["severity"] == "error" for f in r["findings"])),
    _row("probe-healthy", ["probe", "ct200", "--port", "30001", "--json"], _probe("healthy"), 0,
         _has(status="healthy", exit_code=0)),
    _row("probe-unhealthy", ["probe", "ct200", "--port", "30001", "--json"], _probe("unhealthy"), 1,
         _has(status="unhealthy", exit_code=1)),
    _row("service-render", ["service", "render", "ct200", "sglang-ddtree", "--no-verify", "--json"],
         _service_facts, 0, _has(unit_name="sglang-ddtree.service", verified=False)),
    _row("service-up", ["service", "up", "ct200", "sglang-ddtree", "--json"], _service_facts, 0,
         _has(unit_name="sglang-ddtree.service", installed=True, port=30001)),
    _row("service-up-no-probe", ["service", "up", "ct200", "sglang-ddtree", "--no-probe", "--json"],
         _service_facts, 0, _has(probe=None, gpus=[1])),
    _row("service-down", ["service", "down", "ct200", "sglang-ddtree", "--json"], _probe("healthy"),
         0, _has(unit="sglang-ddtree.service", stopped=True, removed=False)),
    _row("service-list", ["service", "list", "ct200", "--json"], _probe("healthy"), 0,
         lambda r: r[0]["unit"] == "sglang-ddtree.service"),
    _row("service-status", ["service", "status", "ct200", "sglang-ddtree", "--json"],
         _probe("healthy"), 0, lambda r: r[0]["active"] == "active"),
    _row("service-logs", ["service", "logs", "ct200", "sglang-ddtree", "--json"], _probe("healthy"),
         0, _has(lines=["one", "\x1b[31mtwo"])),
    _row("payload-deploy", ["payload", "deploy", "ct200", "--venv", VENV, "--json"], _payload, 0,
         _has(action="deployed", venv=VENV)),
    _row("payload-verify", ["payload", "verify", "ct200", "--venv", VENV, "--json"], _payload, 1,
         _has(action="no payload deployed")),
    _row("payload-rollback", ["payload", "rollback", "ct200", "--venv", VENV, "--json"],
         _payload, 0, _has(action="rolled back")),
    _row("payload-status", ["payload", "status", "ct200", "--json"], _payload, 0,
         lambda r: r[VENV]["deployed_at"] == EPOCH_ISO),
    _row("overlay", ["overlay", "--abi", "cu130", "--json"], _overlay, 0, _has(result="applied")),
    _row("overlay-dry-run", ["overlay", "--abi", "cu130", "--dry-run", "--json"], _overlay, 0,
         _has(id="abc")),
    _row("overlay-rollback", ["overlay", "rollback", "ct200", "--venv", VENV, "--json"],
         _overlay, 0, _has(result="rolled back", venv=VENV)),
    _row("overlay-history", ["overlay", "history", "ct200", "--venv", VENV, "--json"], _overlay, 0,
         lambda r: r[VENV][0]["time"] == "2026-12-03T15:04:05+00:00"),
    _row("venv-clone", ["venv", "clone", "ct200", "/root/venv", "/root/venv_new", "--json"], _clone,
         0, _has(dst="/root/venv_new", fixed_scripts=["pip", "sglang"])),
    _row("hosts-list", ["hosts", "list", "--json"], _nothing, 0,
         lambda r: set(r["hosts"]) == {"ct129", "ct200"} and "sglang-ddtree" in r["deployments"]),
    _row("hosts-check", ["hosts", "check", "--json"], _hosts, 3,
         _per_host(ct129=False, ct200=True)),
    _row("hosts-trust", ["hosts", "trust", "ct200", "--yes", "--json"], _hosts, 0,
         _has(status="added", fingerprint="SHA256:abc")),
    _row("hosts-disconnect", ["hosts", "disconnect", "--json"], _hosts, 0,
         lambda r: r == [{"host": "ct129", "ended": False}, {"host": "ct200", "ended": True}]),
    _row("bench-recommend", ["bench", "recommend", "--results", str(RECORDED), "--json"], _nothing,
         0, lambda r: r["overall"]["algorithm"] == "ddtree"),
    _row("bench-report", ["bench", "report", "--results", str(RECORDED), "--out", "{tmp}",
                          "--json"], _nothing, 0, lambda r: r["files"],
         marks=pytest.mark.integration),  # matplotlib may ask fc-list for fonts
    _row("lab-status", ["lab", "status", "--json"], _lab, 1,
         lambda r: [h["name"] for h in r] == ["ct129", "ct200"]),
]


@pytest.mark.parametrize(("name", "argv", "stubs", "code", "holds"), SUCCESS)
def test_a_success_is_one_results_document(
        name: str, argv: list[str], stubs: Stubs, code: int, holds: Callable[[Any], Any],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    stubs(monkeypatch, tmp_path)
    rc, out, err = _main(capsys, *[a.replace("{tmp}", str(tmp_path / "out")) for a in argv])
    assert rc == code, (out, err)
    doc = check(out, rc)  # the schema, exit_code == the process's, times as text
    assert isinstance(doc, Success), doc
    assert holds(doc.results) is not False, doc.results


FAILURE: list[tuple[str, list[str], Stubs, int, str]] = [
    ("unknown-host", ["service", "logs", "nosuch", "x", "--json"], _nothing, 2,
     "unknown host 'nosuch'"),
    ("apply-not-confirmed", ["apply", "ct200", "--json"], _apply, 2,
     "confirm on a terminal, or pass --yes"),
    ("service-down-not-ours", ["service", "down", "ct200", "other", "--json"],
     lambda mp, tmp: (_units(mp), mp.setattr("ddtree_deploy.service.install.down",
                                             lambda t, unit, remove=False: False)),
     1, "other.service: no such ddtree-deploy service on ct200"),
    ("overlay-rollback-fails", ["overlay", "rollback", "ct200", "--venv", VENV, "--json"],
     _overlay_fails, 1, "no backup"),
    ("overlay-relative-venv", ["overlay", "rollback", "ct200", "--venv", "venv", "--json"],
     _nothing, 2, "expected an absolute path"),
    ("venv-clone-protected", ["venv", "clone", "ct129", "/root/venv", "/root/ml-env", "--json"],
     _clone, 1, "would write into venv /root/ml-env"),
    ("doctor-unreachable", ["doctor", "ct129", "--json"], _inventory, 1, "unreachable"),
]


@pytest.mark.parametrize(("name", "argv", "stubs", "code", "said"), FAILURE,
                         ids=[f[0] for f in FAILURE])
def test_a_failure_is_one_error_document(
        name: str, argv: list[str], stubs: Stubs, code: int, said: str,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    stubs(monkeypatch, tmp_path)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    rc, out, err = _main(capsys, *argv)
    assert rc == code, (out, err)
    doc = check(out, rc)
    assert isinstance(doc, Failure), doc
    assert said in doc.error.message, doc.error
    assert said in err  # a person reads it on stderr


def _json_commands() -> list[tuple[str, ...]]:
    """Every command of the help tree (lab's group included) that has --json."""
    import typer

    root = typer.main.get_command(app.build_app())
    found: list[tuple[str, ...]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        if any("--json" in getattr(p, "opts", ()) for p in cmd.params):
            found.append(path)
        for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
            walk(sub, (*path, name))

    walk(root, ())
    return found


# Commands without --json, on purpose: `lab up` and `lab down` build and tear down the local
# rehearsal (docs/lab.md), for a person at a terminal.
WITHOUT_JSON = {("lab", "up"), ("lab", "down")}
# Commands whose --json success runs elsewhere: `bench run` restarts a real server per
# configuration (tests/test_bench_cli.py runs it on a stand-in server and checks this shape).
ELSEWHERE = {("bench", "run")}


def test_every_command_has_json_and_the_table_runs_each() -> None:
    import typer

    root = typer.main.get_command(app.build_app())
    leaves: list[tuple[str, ...]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        subs = getattr(cmd, "commands", None) or {}
        if not subs and path:
            leaves.append(path)
        for name, sub in subs.items():
            walk(sub, (*path, name))

    walk(root, ())
    with_json = set(_json_commands())
    assert {leaf for leaf in leaves if leaf not in with_json} == WITHOUT_JSON
    ran = {tuple(a for a in p[1] if not a.startswith("-") and a[0].islower())
           for p in (s.values for s in SUCCESS)}
    for command in with_json - ELSEWHERE:  # each one's success path is a row of the table
        assert any(r[:len(command)] == command for r in ran), command


@pytest.mark.parametrize("command", _json_commands(), ids=" ".join)
def test_a_usage_error_under_json_is_an_error_document(
        command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _main(capsys, *command, "--json", "--no-such-option")
    assert rc == 2, err
    doc = check(out, rc)
    assert isinstance(doc, Failure) and "--no-such-option" in doc.error.message
    assert doc.error.hint and doc.error.hint.startswith("Try 'ddtree-deploy ")


def test_times_of_older_records_are_said_in_utc() -> None:
    """The host-side scripts write local times with an offset; saved files hold epochs."""
    from ddtree_deploy.isotime import epoch, utc_iso

    assert utc_iso("2026-12-03T16:04:05+0100") == "2026-12-03T15:04:05+00:00"
    assert utc_iso(EPOCH) == EPOCH_ISO and epoch(EPOCH_ISO) == EPOCH
    assert utc_iso("yesterday") == "yesterday" and utc_iso(None) is None
    assert utc_iso("2026-12-03T16:04:05") == "2026-12-03T16:04:05"  # no offset: kept
    assert datetime.datetime.fromisoformat(utc_iso(0.0)).year == 1970


def test_the_gpu_rehearsal_reads_the_document(monkeypatch: pytest.MonkeyPatch) -> None:
    """rehearsal/ runs the CLI with --json (service render, probe, bench) and reads results."""
    from ddtree_deploy.cli import errdoc
    from ddtree_deploy.errors import DeployError

    monkeypatch.syspath_prepend(str(ROOT))
    from rehearsal.servers import results_of

    unit = {"unit": "[Unit]\n", "argv": ["python"], "environment": {}, "working_directory": "/"}
    assert results_of(errdoc.dumps(errdoc.success(unit))) == unit
    assert results_of(errdoc.dumps(errdoc.success({"status": "unhealthy"}, 1))) == {
        "status": "unhealthy"}
    assert results_of(errdoc.dumps(errdoc.of_error(DeployError("boom", hint="h"), 1))) == {
        "error": "boom"}
    assert results_of("", "ssh: connection refused") == {"error": "ssh: connection refused"}
    assert results_of("not json") == {"error": "not json"}


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_json_escapes_a_hosts_c1_and_bidi_controls(terminal: bool) -> None:
    """Host text (a journal line, a log tail) under --json: its C0/C1 controls, DEL and
    bidirectional overrides come out as JSON escapes, on a terminal as in a pipe, and the
    document still reads back to the same text. Before the fix a terminal got rich's
    print_json (ensure_ascii=False): U+009B (the 8-bit CSI) and U+202E reached it raw."""
    import io
    import json

    from rich.console import Console

    from ddtree_deploy.cli.common import print_results

    line = "journal \u009b2J \x1b[31m \x7f \u202egnp.exe \u2028 \u2066"
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=terminal, color_system=None)
    print_results(con, {"lines": [line]})
    out = buf.getvalue()
    for raw in ("\u009b", "\x1b", "\x7f", "\u202e", "\u2028", "\u2066"):
        assert raw not in out
    assert json.loads(out)["results"] == {"lines": [line]}


def test_inventory_json_leaves_out_the_secrets_digests(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The services' secrets digests (root-only on the host, kept in the facts cache for plan)
    are never printed: before, `inventory --json` carried them, for anyone a user pastes the
    output to."""
    from ddtree_deploy.transport.fanout import Outcome

    digest = "scrypt$" + "ab" * 16 + "$" + "cd" * 32
    facts = _facts()
    facts.tool.secrets_digests = {"sglang-ddtree": digest}
    monkeypatch.setattr("ddtree_deploy.cli.inventory.collect",
                        lambda config, names, **_: [Outcome("ct200", value=facts)])
    rc, out, err = _main(capsys, "inventory", "ct200", "--json")
    assert rc == 0, err
    doc = check(out, rc)
    assert isinstance(doc, Success), doc
    assert "managed_units" in doc.results[0]["tool"]  # the rest of the tool state is there
    assert digest not in out and "secrets_digests" not in out
    assert facts.tool.secrets_digests == {"sglang-ddtree": digest}  # plan still reads it
