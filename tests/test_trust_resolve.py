"""`hosts trust HOST`: which host it means, how long it waits, and a hosts file with an error.

- A host reached without SSH (`transport: local`, and the built-in `localhost`) has no key to
  trust: refused with exit 2 saying so (it said "an ~/.ssh/config alias", or went to
  localhost:22 as if `localhost` were an address).
- A host of the file is waited for as long as its `connect_timeout` says (it was always 10 s):
  a loopback port that accepts and never answers, with `connect_timeout: 1`.
- A hosts file with an error is that error, file and line, exit 2: it was read past, and the
  host's name was then looked up as a DNS name.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import errdoc
from ddtree_deploy.cli.app import build_app
from ddtree_deploy.errors import DeployError
from ddtree_deploy.transport.hostkeys import names_an_ip


def _cli(hosts: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """The exit code and the --json document, as main() prints them for a DeployError."""
    argv = ["--hosts", str(hosts), "hosts", "trust", *args, "--json"]
    result = CliRunner().invoke(build_app(argv), argv)
    if isinstance(result.exception, DeployError):
        code = int(result.exception.exit_code)
        return code, errdoc.of_error(result.exception, code)
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture()
def hosts(tmp_path: Path, mute_port: tuple[int, list[socket.socket]]) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(f"version: 1\nhosts:\n  ws:\n    transport: local\n"
                    f"  mute:\n    address: 127.0.0.1\n    port: {mute_port[0]}\n"
                    f"    connect_timeout: 1\n    known_hosts: {tmp_path / 'known_hosts'}\n")
    return path


@pytest.mark.parametrize("host", ["ws", "localhost"])
def test_a_host_reached_without_ssh_has_no_key_to_trust(hosts: Path, host: str) -> None:
    code, doc = _cli(hosts, host, "--yes")
    assert code == 2 and doc["exit_code"] == 2, doc
    assert doc["error"]["message"].startswith(f"{host} is this machine (transport: local)")
    assert "ddtree-deploy hosts trust 127.0.0.1:PORT" in doc["error"]["hint"]


def test_a_host_is_waited_for_as_its_connect_timeout_says(hosts: Path) -> None:
    code, doc = _cli(hosts, "mute", "--yes")
    assert code == 1, doc
    assert doc["error"]["message"].endswith("unreachable: no SSH banner within 1s"), doc
    assert not (hosts.parent / "known_hosts").exists()


def test_a_hosts_file_with_an_error_is_that_error(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.yaml"
    bad.write_text("version: 1\nhosts:\n  h1:\n    address: 127.0.0.1\n    port: 70000\n")
    code, doc = _cli(bad, "h1", "--yes", "--timeout", "1")
    assert code == 2, doc
    assert doc["error"]["file"] == str(bad) and doc["error"]["line"] == 5, doc
    # an IP address needs no hosts file: trusted as it is (here: nothing listens)
    code, doc = _cli(bad, "127.0.0.1:1", "--yes", "--timeout", "1")
    assert code == 1 and "127.0.0.1:1" in doc["error"]["message"], doc
    assert "connection refused" in doc["error"]["message"], doc


@pytest.mark.parametrize(("text", "ip"), [
    ("127.0.0.1", True), ("127.0.0.1:22", True), ("root@10.0.0.1:2222", True),
    ("[::1]:22", True), ("::1", True), ("ct200", False), ("ct200:22", False),
    ("host.example.com", False),
    # the brackets without a port, as parse_address takes them (was: not an IP, so
    # `hosts trust [::1]` past a broken hosts file was that file's error)
    ("[::1]", True), ("root@[::1]", True), ("[fe80::1%eth0]", True), ("[ct200]", False)])
def test_names_an_ip(text: str, ip: bool) -> None:
    assert names_an_ip(text) is ip


def test_hosts_list_shows_a_local_host_as_local(hosts: Path) -> None:
    """`transport: local` is no `localhost:22` as root (what the table said)."""
    argv = ["--hosts", str(hosts), "hosts", "list"]
    result = CliRunner().invoke(build_app(argv), argv)
    assert result.exit_code == 0, result.output
    rows = {line.split("\t")[0]: line.split("\t") for line in result.stdout.splitlines()
            if not line.startswith("#")}
    assert rows["ws"][1:3] == ["local (no SSH)", "-"], rows
    assert rows["mute"][1].startswith("127.0.0.1:"), rows
