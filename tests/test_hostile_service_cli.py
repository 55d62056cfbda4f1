"""`service status | logs | list` answer truly about units that are not there, with --json
on errors too, and print a host's text as text.

The host is a stand-in: `open_transport` and the two calls that read the host
(`list_units`, `logs`) are replaced, so the command line itself is what is tested (main():
exit codes, error rendering). Before the fix `service logs` of an unknown service printed
nothing and exited 0, and `service status --json` printed plain text.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.cli import app
from ddtree_deploy.service import install
from ddtree_deploy.service.install import UnitState

GOOD = Path(__file__).parent / "data" / "hosts_good" / "minimal.yaml"
OURS = UnitState(unit="sglang-x.service", active="active", sub="running", restarts=0,
                 main_pid=42, exit_status=0, deployment="x")


@pytest.fixture()
def host(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {"journal": "line one\n\x1b[31mred\x1b[0m [/x]\n", "asked": []}

    @contextlib.contextmanager
    def fake_open(config: Any, spec: Any, **_: Any) -> Iterator[object]:
        yield object()

    def fake_logs(t: object, unit: str, lines: int = 200) -> str:
        seen["asked"].append(unit)
        return str(seen["journal"])

    monkeypatch.setattr("ddtree_deploy.transport.connect.open_transport", fake_open)
    monkeypatch.setattr(install, "list_units", lambda t: [OURS])
    monkeypatch.setattr(install, "logs", fake_logs)
    return seen


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        app.main(["--hosts", str(GOOD), *argv])
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.out, captured.err


def test_logs_of_an_unknown_service_is_an_error(host: dict[str, Any],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _main(capsys, "service", "logs", "one", "nosuch")
    assert rc == 1 and out == ""
    assert "nosuch.service: no such ddtree-deploy service on one" in err
    assert host["asked"] == []  # the journal of a unit that is not ours is not read


def test_logs_of_a_known_service_come_as_text(host: dict[str, Any],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _main(capsys, "service", "logs", "one", "sglang-x")
    assert rc == 0 and host["asked"] == ["sglang-x.service"]
    assert out == "line one\n\\x1b[31mred\\x1b[0m [/x]\n"


def test_status_of_an_unknown_service_with_json_is_json(host: dict[str, Any],
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    rc, out, err = _main(capsys, "service", "status", "one", "nosuch", "--json")
    assert rc == 1
    data = json.loads(out)
    assert data == {"ok": False, "error": {
        "message": "nosuch.service: no such ddtree-deploy service on one",
        "hint": None, "file": None, "line": None}, "exit_code": 1, "schema": 1}
    assert "no such ddtree-deploy service" in err


def test_status_and_list_of_a_known_service(host: dict[str, Any],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _main(capsys, "service", "status", "one", "sglang-x", "--json")
    assert rc == 0 and json.loads(out)["results"][0]["unit"] == "sglang-x.service"
    rc, out, _ = _main(capsys, "service", "list", "one")
    assert rc == 0 and "running" in out and "…" not in out
    assert all(len(line) <= 80 for line in out.splitlines())
