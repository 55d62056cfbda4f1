"""The tool's own output points at docs/troubleshooting.md by id (issue 31), and the anchor it
names is there: a probe's diagnosis under its fix, doctor's findings on stderr."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"


def _anchors(text: str) -> list[str]:
    return re.findall(r"docs/troubleshooting\.md#([\w.*-]+)", text)


def _assert_on_the_page(ids: list[str]) -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert ids
    for anchor in ids:
        assert f'<a id="{anchor}"></a>' in page, anchor


@pytest.mark.unit
def test_a_probe_diagnosis_names_its_section(capsys: pytest.CaptureFixture[str]) -> None:
    from ddtree_deploy.cli.service import _render_verdict
    from ddtree_deploy.health.signatures import SIGNATURES, match_line
    from ddtree_deploy.health.verdict import Verdict

    oom = next(s for s in SIGNATURES if s.id == "cuda-oom")
    found = match_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                       {"host": "ct200", "deployment": "d"})
    assert found is not None and found.id == oom.id
    _render_verdict("sglang-d", Verdict("unhealthy", "crash signature", diagnosis=[found]))
    out = capsys.readouterr().out
    assert "more: docs/troubleshooting.md#cuda-oom" in out
    _assert_on_the_page(_anchors(out))


@pytest.mark.integration  # doctor gathers the facts of a local host: processes
def test_doctor_names_the_section_of_its_findings(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-venv"
    (tmp_path / "hosts.yaml").write_text(
        f"version: 1\nhosts:\n  ws:\n    transport: local\n    venvs:\n"
        f"      v: {{path: {missing}, role: serving}}\n")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
               XDG_STATE_HOME=str(tmp_path / "state"), NO_COLOR="1", DDTREE_DEPLOY_HOSTS="")
    ran = subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                          str(tmp_path / "hosts.yaml"), "doctor", "ws", "--venv", str(missing),
                          "--refresh"], capture_output=True, text=True, timeout=300, check=False,
                         env=env, cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr
    assert "venv.missing" in ran.stdout
    assert "docs/troubleshooting.md#venv.missing" in ran.stderr
    assert "troubleshooting" not in ran.stdout  # a pipe reading the findings gets only them
    _assert_on_the_page(_anchors(ran.stderr))
