"""OpenSshTransport's cipher preference: what it offers, and that the real client accepts it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree_deploy.transport import openssh
from ddtree_deploy.transport.openssh import OpenSshTransport, offered_ciphers

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


def test_the_offer_is_the_clients_known_ciphers_with_aes_gcm_first() -> None:
    assert offered_ciphers(set(OPENSSH_DEFAULT))[:2] == ["aes128-gcm@openssh.com",
                                                        "aes256-gcm@openssh.com"]
    assert sorted(offered_ciphers(set(OPENSSH_DEFAULT))) == sorted(OPENSSH_DEFAULT)
    # a client without chacha20 (FIPS builds): offered what it has, AES-GCM first
    fips = set(OPENSSH_DEFAULT) - {"chacha20-poly1305@openssh.com"}
    assert offered_ciphers(fips) == ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
                                     "aes128-ctr", "aes192-ctr", "aes256-ctr"]
    # no AES-GCM (built without OpenSSL) or an unreadable list: no option, the client's default
    assert offered_ciphers({"chacha20-poly1305@openssh.com", "aes128-ctr"}) == []
    assert offered_ciphers(frozenset()) == []


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client installed")
@pytest.mark.parametrize("load_ssh_config", [False, True])
def test_the_transport_offers_it_unless_the_hosts_ssh_config_decides(
        control: Path, tmp_path: Path, load_ssh_config: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def known(ssh: str) -> frozenset[str]:
        asked.append(ssh)
        return frozenset(OPENSSH_DEFAULT)

    monkeypatch.setattr(openssh, "client_ciphers", known)
    t = OpenSshTransport("ct200", known_hosts=tmp_path / "known_hosts", port=2222, user="root",
                         load_ssh_config=load_ssh_config)
    assert not any(a.startswith("Ciphers=") for a in t._base)  # nothing asked at construction
    opts = t.cipher_options()
    assert opts == t.cipher_options()  # asked once
    if load_ssh_config:
        assert opts == [] and asked == []  # its ~/.ssh/config's Ciphers line stands
    else:
        assert ciphers(opts)[:2] == ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]
        assert asked == [shutil.which("ssh")]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client installed")
def test_the_local_client_accepts_what_is_offered(control: Path, tmp_path: Path) -> None:
    """The real client: what the transport offers parses (`ssh -G`), AES-GCM first."""
    t = OpenSshTransport("ct200", known_hosts=tmp_path / "known_hosts", port=2222, user="root")
    opts = t.cipher_options()
    done = subprocess.run([*t._base, *opts, "-G", "ct200"], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("ciphers "))
    if opts:
        assert line.split(" ", 1)[1].split(",")[:2] == ["aes128-gcm@openssh.com",
                                                      "aes256-gcm@openssh.com"]
