"""OpenSshTransport's cipher preference, read from the argv it builds (no ssh is run)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree_deploy.transport.openssh import OpenSshTransport

# OpenSSH 9's default client cipher list (ssh_config(5), Ciphers), in its own order
OPENSSH_DEFAULT = ["chacha20-poly1305@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr",
                   "aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]


@pytest.fixture
def control(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short private folder for the transport's control folder (nothing is connected)."""
    runtime = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))  # short: socket paths are limited
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    yield runtime
    shutil.rmtree(runtime, ignore_errors=True)


def ciphers(argv: list[str]) -> list[str]:
    found = [argv[i + 1] for i, arg in enumerate(argv[:-1])
             if arg == "-o" and argv[i + 1].startswith("Ciphers=")]
    assert len(found) == 1, argv
    return found[0].removeprefix("Ciphers=").split(",")


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client installed")
@pytest.mark.parametrize("load_ssh_config", [False, True])
def test_aes_gcm_is_preferred_and_no_default_cipher_is_dropped(
        control: Path, tmp_path: Path, load_ssh_config: bool) -> None:
    t = OpenSshTransport("ct200", known_hosts=tmp_path / "known_hosts", port=2222, user="root",
                         load_ssh_config=load_ssh_config)
    got = ciphers(t._base)
    assert got[:2] == ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]
    assert sorted(got) == sorted(OPENSSH_DEFAULT)  # reordered only: any server negotiates as before
    # every other option is still there, before the control socket
    assert t._base.index("BatchMode=yes") < t._base.index("-S")
    assert t._base[t._base.index("-S") + 1] == str(t.control_path)
