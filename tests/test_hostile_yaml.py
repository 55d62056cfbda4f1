"""Hostile YAML (hosts.yaml, an overlay lane file, payload.yaml): refused before it is built.

The cases are data (tests/data/hostile_cases_yaml.json): recursive aliases, a "billion
laughs" alias bomb, deep nesting, NUL characters in paths, tags. Each is loaded through the
command line in a bounded child process (tests/hostile_runner.py): exit 2, the file and
line in the message, no traceback. Before the fix these ended in RecursionError, in
MemoryError (about 3 GB and a minute, here cut by the address-space limit), or loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile_runner import GOOD_HOSTS, run_cli

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "hostile_cases_yaml.json").read_text())["yaml"]


def _argv(case: dict[str, Any], tmp_path: Path) -> tuple[list[str], Path]:
    if case["file"] == "hosts":
        path = tmp_path / "hosts.yaml"
        return ["--hosts", str(path), "hosts", "list"], path
    if case["file"] == "lane":
        path = tmp_path / "lane.yaml"
        return ["--hosts", str(GOOD_HOSTS), "overlay", "--abi", str(path), "--dry-run"], path
    folder = tmp_path / "payload"
    folder.mkdir()
    path = folder / "payload.yaml"
    return ["--hosts", str(GOOD_HOSTS), "payload", "deploy", "localhost", "--venv",
            str(tmp_path / "no-venv"), "--payload", str(folder)], path


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_hostile_yaml_is_refused_with_file_and_line(case: dict[str, Any], tmp_path: Path) -> None:
    argv, path = _argv(case, tmp_path)
    path.write_text(case["text"])
    ran = run_cli(argv, cwd=tmp_path)
    assert not ran.traceback, ran.stderr[-2000:]
    assert ran.rc == 2, ran.stderr[-2000:]
    assert f"{path}{case['where']}" in ran.stderr, ran.stderr
    assert case["says"] in ran.stderr, ran.stderr
    if "lines" in case:
        assert len(ran.stderr.strip().splitlines()) == case["lines"], ran.stderr
