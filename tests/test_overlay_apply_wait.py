"""The apply's status call waits on the host for the run's result (remote/overlay_apply.py
`--wait`): the workstation learns of the end within the host's 20 ms poll, not at its next
round trip (benchmarks/RESULTS.md, run H3, the same run: the cold apply took 0.44 s with the
workstation's 0.2 s poll, 0.21 s with the wait on the host)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_deploy.overlay import apply as apply_mod
from ddtree_deploy.remote import overlay_apply
from ddtree_deploy.remote.runner import RemoteScriptError
from ddtree_deploy.transport import LocalTransport
from ddtree_deploy.transport.base import Result

TOKEN = "ab" * 16


def _status(venv: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            *extra: str) -> tuple[dict[str, object], list[float]]:
    sleeps: list[float] = []
    result = venv / ".ddtree-deploy" / "overlay" / "results" / f"{TOKEN}.json"

    def sleep(seconds: float) -> None:  # the run ends while the host waits
        sleeps.append(seconds)
        result.write_text(json.dumps({"result": "applied", "message": "done"}))

    monkeypatch.setattr(overlay_apply.time, "sleep", sleep)
    overlay_apply.main(["--venv", str(venv), "--token", TOKEN, *extra, "status"])
    return json.loads(capsys.readouterr().out), sleeps


def test_status_with_wait_returns_the_result_that_appears_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    out, sleeps = _status(tmp_path, monkeypatch, capsys, "--wait", "30")
    assert out["token_result"] == {"result": "applied", "message": "done"}
    assert sleeps == [0.02]  # one local poll, then the file was there


def test_status_without_wait_answers_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    out, sleeps = _status(tmp_path, monkeypatch, capsys)
    assert out["token_result"] is None and sleeps == []
    assert out["running"] is False


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _wait_with(monkeypatch: pytest.MonkeyPatch, answers: list[object], took: float
               ) -> tuple[_Clock, list[tuple[str, ...]]]:
    """apply.wait() against a fake host: each status call takes `took` seconds and gives the
    next answer (a dict, or an exception to raise)."""
    clock = _Clock()
    calls: list[tuple[str, ...]] = []

    def call(t: object, venv: str, *args: str, sudo: bool, timeout: float = 120) -> object:
        calls.append(args)
        clock.now += took
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(apply_mod, "_call", call)
    monkeypatch.setattr(apply_mod.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(apply_mod.time, "sleep", clock.sleep)
    outcome = apply_mod.wait(LocalTransport(host="h"), "/v", TOKEN, poll=1.0)
    assert outcome.result == "applied"
    return clock, calls


RUNNING = {"running": True, "holder": {"command": "apply"}, "token_result": None}
DONE = {"token_result": {"result": "applied", "message": ""}}


def test_wait_asks_the_host_to_wait_and_does_not_sleep_after_it_did(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock, calls = _wait_with(monkeypatch, [RUNNING, RUNNING, DONE], took=1.0)
    assert calls == [("status", "--token", TOKEN, "--wait", "1")] * 3
    assert clock.sleeps == []


def test_wait_paces_a_host_that_answers_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, _ = _wait_with(monkeypatch, [RUNNING, RUNNING, DONE], took=0.01)
    assert clock.sleeps == [1.0, 1.0]


def test_wait_falls_back_for_a_script_without_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    old = Result(command="python overlay.py", exit_code=2, stdout="", duration=0.05,
                 stderr="apply_remote: error: unrecognized arguments: --wait 1\n")
    refusal = RemoteScriptError("h: the overlay script failed", problem="exit", result=old)
    clock, calls = _wait_with(monkeypatch, [refusal, RUNNING, DONE], took=0.01)
    assert calls[0][-2:] == ("--wait", "1")
    assert calls[1:] == [("status", "--token", TOKEN)] * 2
    assert clock.sleeps == [1.0]
