"""apply's run log (issue 31): a 0600 JSON-lines file per host and run under the state folder,
with who and when, every command's display form (secrets as ***), exit and seconds, each step."""

from __future__ import annotations

import datetime
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.converge.runlog import RunLog, runs_dir
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.local import LocalTransport


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def _events(log: RunLog) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.path.read_text().splitlines()]


def test_a_run_log_is_private_and_says_who_when_what(state: Path) -> None:
    log = RunLog("ct200")
    log.start({"command": "apply", "hosts": ["ct200"]}, "hosts.yaml", "ddtree-deploy 0.1.0")
    log.command("systemctl start x", 0, 1.23456)
    log.step("service.start", "x", "dep", 2.5, True)
    log.end(None)
    assert log.path.parent == runs_dir() and runs_dir().is_relative_to(state)
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.path.parent.stat().st_mode) == 0o700
    start, command, step, end = _events(log)
    assert start["event"] == "start" and start["who"] and start["host"] == "ct200"
    assert start["what"] == {"command": "apply", "hosts": ["ct200"]}
    when = datetime.datetime.fromisoformat(str(start["at"]))  # ISO-8601, UTC
    assert when.utcoffset() == datetime.timedelta(0)
    assert command == {**command, "command": "systemctl start x", "exit": 0, "seconds": 1.235}
    assert step["kind"] == "service.start" and step["ok"] is True and step["seconds"] == 2.5
    assert end["event"] == "end" and end["ok"] is True and end["error"] is None


def test_a_failed_run_ends_with_its_error(state: Path) -> None:
    log = RunLog("h")
    log.end("h: step 'x' failed")
    assert _events(log)[-1]["ok"] is False
    assert _events(log)[-1]["error"] == "h: step 'x' failed"


def test_a_log_that_cannot_be_written_does_not_stop_the_run(state: Path) -> None:
    state.mkdir()
    (state / "ddtree-deploy").write_text("a file where the folder goes")
    said: list[str] = []
    log = RunLog("h", say=said.append)
    log.command("true", 0, 0.1)  # no error: the run goes on
    log.end(None)
    assert len(said) == 1 and "not kept" in said[0]


@pytest.mark.integration  # a command runs
def test_observers_hear_each_command_with_secrets_masked(state: Path) -> None:
    heard: list[tuple[str, int | None, float]] = []
    t = LocalTransport()
    t.observers = (lambda c, code, s, out, err: heard.append((c, code, s, out, err)),)
    t.run(Command.of("sh", "-c", 'echo "token $0"; echo "err $0" >&2; exit 3', "hunter2",
                     secrets=frozenset({"hunter2"})))
    ((command, code, seconds, out, err),) = heard
    assert code == 3 and seconds >= 0
    assert "hunter2" not in command and "***" in command
    assert out == "token ***\n" and err == "err ***\n"  # -vv shows output, never a secret
    assert LocalTransport().observers == ()  # one transport's observers are its own


def test_apply_gives_the_lane_copy_its_progress_bars(monkeypatch: pytest.MonkeyPatch,
                                                     state: Path) -> None:
    """apply's lane.overlay step moves bytes with the overlay's bars (issue 31: minutes of
    silence before), the sink apply made on a terminal."""
    from ddtree_deploy.config.hosts import load_config
    from ddtree_deploy.converge.steps import Acting, Step, lane_overlay
    from ddtree_deploy.overlay import run
    from ddtree_deploy.overlay.progress import CountingProgress
    from ddtree_deploy.resources import embedded_hosts_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(state / "cache"))  # BlobCache's folder
    seen: list[object] = []
    noted: list[str] = []

    def overlay(*_a: object, **kw: Any) -> None:
        seen.append(kw.get("progress"))
        for status in ({"journal": {"phase": "checking"}}, {"journal": None}, {}):
            kw["on_status"](status)  # the host's apply, polled: its phase to the status line

    monkeypatch.setattr(run, "run_overlay", overlay)
    config = load_config(embedded_hosts_file())
    bars = CountingProgress()
    ctx = Acting(config, config.host("ct200"), None, None, progress=bars,  # type: ignore[arg-type]
                 note=noted.append)
    step = Step("lane.overlay", "ct200", "sglang-ddtree", "cu130", "",
                params=lane_overlay.LaneOverlay("/root/venv_sglang211", "cu130"))
    lane_overlay.act(ctx, step)
    assert seen == [bars]
    assert noted == ["on the host: checking"]


def test_the_deployments_secrets_are_masked_in_every_line(state: Path, tmp_path: Path) -> None:
    """apply_host hands the log the deployments' API keys and HF tokens (secret_values):
    an error or a command that carried one is logged with *** instead."""
    from ddtree_deploy.config.hosts import load_config
    from ddtree_deploy.converge.runner import secret_values
    from ddtree_deploy.resources import embedded_hosts_file

    (tmp_path / "key").write_text("sk-live-123\n")
    (tmp_path / "hf").write_text("hf_abcdef\n")
    text = embedded_hosts_file().read_text().replace(
        "    payload: true ", f"    api_key_file: {tmp_path / 'key'}\n"
                              f"    hf_token_file: {tmp_path / 'hf'}\n    payload: true ")
    (tmp_path / "hosts.yaml").write_text(text)
    config = load_config(tmp_path / "hosts.yaml")
    assert secret_values(config, config.host("ct200")) == {"sk-live-123", "hf_abcdef"}
    assert secret_values(config, config.host("ct129")) == frozenset()
    log = RunLog("ct200")
    log.redact = secret_values(config, config.host("ct200"))
    log.start({"command": "apply", "hosts": ["ct200"], "x": ["hf_abcdef"]}, "h.yaml", "t")
    log.command("curl -H 'Authorization: Bearer sk-live-123' ...", 0, 0.1)
    log.end("ct200: step failed: HF_TOKEN=hf_abcdef refused")
    written = log.path.read_text()
    assert "sk-live-123" not in written and "hf_abcdef" not in written
    start, command, end = _events(log)
    assert start["what"]["x"] == ["***"]  # type: ignore[index]
    assert "Bearer ***" in str(command["command"]) and "HF_TOKEN=***" in str(end["error"])
