"""Careless and hostile command lines: a clear message, the documented exit code, no
traceback, no hang (tests/data/hostile_cases_cli.json; each case in a bounded child)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from hostile_runner import GOOD_HOSTS, Ran, run_cli

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "hostile_cases_cli.json").read_text())["cases"]


def _closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nobody listens there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def _setup(case: dict[str, Any], tmp_path: Path, values: dict[str, str]) -> None:
    for rel, text in case.get("files", {}).items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_fill(text, values))
    for rel, hexed in case.get("bytes", {}).items():
        (tmp_path / rel).write_bytes(bytes.fromhex(hexed))
    for rel in case.get("fifos", []):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(tmp_path / rel)
    for rel, target in case.get("links", {}).items():
        os.symlink(_fill(target, values), tmp_path / rel)
    if "deep_json" in case:
        (tmp_path / case["deep_json"]).write_text("[" * 200_000 + "]" * 200_000)


def _run(case: dict[str, Any], tmp_path: Path) -> tuple[Ran, dict[str, str]]:
    from ddtree_deploy import __version__

    values = {"tmp": str(tmp_path), "good": str(GOOD_HOSTS), "version": __version__,
              "closed1": str(_closed_port()), "closed2": str(_closed_port())}
    _setup(case, tmp_path, values)
    argv = [_fill(a, values) for a in case["argv"]]
    if "stdout" in case:
        with open(case["stdout"], "wb") as sink:
            ran = run_cli(argv, cwd=tmp_path, env=case.get("env"), stdout=sink,
                          before=case.get("before", ""))
    else:
        ran = run_cli(argv, cwd=tmp_path, env=case.get("env"), before=case.get("before", ""))
    return ran, values


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_hostile_command_line(case: dict[str, Any], tmp_path: Path) -> None:
    ran, values = _run(case, tmp_path)
    shown = f"rc={ran.rc}\nstdout:\n{ran.stdout[-3000:]}\nstderr:\n{ran.stderr[-3000:]}"
    assert not ran.traceback, shown
    assert ran.rc == case["rc"], shown
    for text in case.get("stderr_has", []):
        assert _fill(text, values) in ran.stderr, shown
    for text in case.get("stderr_lacks", []):
        assert text not in ran.stderr, shown
    for text in case.get("stdout_has", []):
        assert text in ran.stdout, shown
    for text in case.get("stdout_lacks", []):
        assert text not in ran.stdout, shown
    if "max_width" in case:
        wide = [line for line in ran.stdout.splitlines() if len(line) > case["max_width"]]
        assert wide == [], shown
    if "stdout_json_error" in case:
        data = json.loads(ran.stdout)
        assert case["stdout_json_error"] in data["error"]["message"]
        assert data["exit_code"] == case["rc"] and data["ok"] is False
