"""One table of known_hosts situations (data/hostkey_cases.yaml), run over BOTH SSH paths.

The OpenSSH client (facts) and paramiko (apply, overlay, payload, service) must accept the
same known_hosts situations and refuse the same ones with the same error, against a real
sshd on loopback (sshd_fixture.py). Nothing is ever written to the known_hosts file.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostkey_attempt import attempt
from sshd_fixture import Sshd, keygen, openssh_fingerprint, sshd_available

HERE = Path(__file__).parent
CASES: list[dict[str, Any]] = yaml.safe_load(
    (HERE / "data" / "hostkey_cases.yaml").read_text(encoding="utf-8"))["cases"]
TRANSPORTS = ["openssh", "paramiko"]
CHILD_MEMORY = 2 << 30  # bytes of address space for a child attempt
CHILD_TIMEOUT = 60  # seconds: a hang is a failure, not a stalled run

pytestmark = [pytest.mark.sshd, pytest.mark.usefixtures("openssh_control"),
              pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")]



@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    return {"old": keygen(folder / "old"), "ecdsa": keygen(folder / "ecdsa", "ecdsa"),
            "ca": keygen(folder / "ca"), "cert_ca": keygen(folder / "cert_ca")}


@pytest.fixture(scope="module")
def cert_sshd(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]) -> Iterator[Sshd]:
    """An sshd whose host key also comes with a certificate signed by keys['cert_ca']."""
    reason = sshd_available()
    if reason:
        pytest.skip(reason)
    server = Sshd(tmp_path_factory.mktemp("cert-sshd"), host_ca=keys["cert_ca"])
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    """A web server on loopback: what answers on a port that should be SSH's."""

    class Quiet(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()
    thread.join(5)


def _pub(path: Path) -> str:
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _known_hosts(case: dict[str, Any], folder: Path, values: dict[str, str]) -> Path:
    path = folder / case.get("file", "known_hosts")
    path.parent.mkdir(parents=True, exist_ok=True)
    kind = case.get("kind", "file")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "file":
        path.write_text("".join(line.format(**values) + "\n" for line in case["lines"]))
        if case.get("hash"):
            subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(path)], check=True,
                           capture_output=True)
            assert "|1|" in path.read_text() and "127.0.0.1" not in path.read_text()
            Path(f"{path}.old").unlink()
    return path


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def _in_child(transport: str, known_hosts: Path, port: int, identity: Path) -> dict[str, Any]:
    """The attempt in a child process: bounded in memory and time, its stderr clean."""
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / "hostkey_attempt.py"), transport, str(known_hosts),
             str(port), str(identity)],
            capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False,
            preexec_fn=_limit_memory, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the attempt hung (no answer within {CHILD_TIMEOUT}s)")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_both_paths_agree(case: dict[str, Any], transport: str, request: pytest.FixtureRequest,
                          tmp_path: Path, keys: dict[str, Path]) -> None:
    sshd: Sshd = request.getfixturevalue("sshd")
    server = case.get("server", "sshd")
    if server == "cert":
        sshd = request.getfixturevalue("cert_sshd")
    port = request.getfixturevalue("web") if server == "http" else sshd.port
    values = {"port": str(port), "key": _pub(sshd.host_key),
              "key_b64": _pub(sshd.host_key).split()[1],
              "fp": openssh_fingerprint(sshd.host_key.with_suffix(".pub")),
              **{name: _pub(path) for name, path in keys.items()},
              "old_fp": openssh_fingerprint(keys["old"].with_suffix(".pub")),
              "ecdsa_fp": openssh_fingerprint(keys["ecdsa"].with_suffix(".pub"))}
    known_hosts = _known_hosts(case, tmp_path, values)
    values["path"] = str(known_hosts)
    before = known_hosts.read_bytes() if known_hosts.is_file() else None
    if case.get("child"):
        outcome = _in_child(transport, known_hosts, port, sshd.client_key)
    else:
        outcome = attempt(transport, known_hosts, port, sshd.client_key)
    expect = case["expect"]
    if expect == "accept":
        assert outcome == {"accepted": True}, outcome
    else:
        assert expect["refuse"] in outcome.get("classes", []), outcome
        for words in expect["contains"]:
            assert words.format(**values) in outcome["message"], outcome["message"]
    if case.get("kind", "file") == "file":
        assert known_hosts.read_bytes() == before  # nothing recorded on the fly
    else:
        assert not known_hosts.is_file()


def test_the_table_is_whole() -> None:
    """Every case says what it expects; ids are unique; the server kinds are known."""
    assert len({c["id"] for c in CASES}) == len(CASES)
    for case in CASES:
        assert case["expect"] == "accept" or set(case["expect"]) == {"refuse", "contains"}
        assert case.get("server", "sshd") in ("sshd", "cert", "http")
        assert case.get("kind", "file") in ("file", "fifo", "dir", "missing")
        assert set(case.get("broken_before", [])) <= set(TRANSPORTS)
