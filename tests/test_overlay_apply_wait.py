"""The apply's status call waits on the host for the run's result (remote/overlay_apply.py
`--wait`): the workstation learns of the end within the host's 20 ms poll, not at its next
round trip (benchmarks/RESULTS.md, run H3, the same run: the cold apply took 0.44 s with the
workstation's 0.2 s poll, 0.21 s with the wait on the host)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_deploy.remote import overlay_apply

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
