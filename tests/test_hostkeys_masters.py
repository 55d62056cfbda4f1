"""Host keys beyond the case table: a changed key ends the OpenSSH masters kept to that host
(facts must not keep reading through a connection to the old key), `hosts trust` records
the [addr]:port form, and both paths offer the same host key algorithms."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
from sshd_fixture import Sshd, keygen, openssh_fingerprint

from ddtree_deploy.errors import HostKeyError
from ddtree_deploy.transport.hostkeys import HOST_KEY_ALGORITHMS, HostKeyChangedError, KnownHosts
from ddtree_deploy.transport.openssh import OpenSshTransport
from ddtree_deploy.transport.ssh import SshTransport

pytestmark = [pytest.mark.sshd, pytest.mark.usefixtures("openssh_control"),
              pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")]



def _files(sshd: Sshd, tmp_path: Path) -> tuple[Path, Path, Path]:
    """known_hosts files: the right key; an old key for 127.0.0.1; the right key for the
    same server named `localhost` (another host to the tool)."""
    good, changed, other = tmp_path / "good", tmp_path / "changed", tmp_path / "other"
    good.write_text(sshd.known_hosts_line() + "\n")
    old = keygen(tmp_path / "old").with_suffix(".pub").read_text().split()[:2]
    changed.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(old)}\n")
    other.write_text(sshd.known_hosts_line().replace("127.0.0.1", "localhost") + "\n")
    return good, changed, other


def _kept(sshd: Sshd, known_hosts: Path, address: str = "127.0.0.1") -> OpenSshTransport:
    t = OpenSshTransport(address, known_hosts=known_hosts, port=sshd.port, user="root",
                         identity_file=sshd.client_key, connect_timeout=5, persist=60)
    assert t.run("echo kept").stdout == "kept\n" and t.alive()
    return t


def test_a_changed_key_on_paramiko_ends_the_masters_kept_to_that_host(
        sshd: Sshd, tmp_path: Path) -> None:
    good, changed, other = _files(sshd, tmp_path)
    kept, elsewhere = _kept(sshd, good), _kept(sshd, other, "localhost")
    ssh = SshTransport("127.0.0.1", known_hosts=changed, port=sshd.port, user="root",
                       identity_file=sshd.client_key, load_ssh_config=False, connect_timeout=5)
    with pytest.raises(HostKeyChangedError) as info:
        ssh.run("true")
    assert openssh_fingerprint(sshd.host_key.with_suffix(".pub")) in str(info.value)
    assert not kept.alive()
    assert elsewhere.alive()  # another host's master stays


def test_a_changed_key_on_openssh_ends_the_other_masters(sshd: Sshd, tmp_path: Path) -> None:
    good, changed, other = _files(sshd, tmp_path)
    kept, elsewhere = _kept(sshd, good), _kept(sshd, other, "localhost")
    fresh = OpenSshTransport("127.0.0.1", known_hosts=changed, port=sshd.port, user="root",
                             identity_file=sshd.client_key, connect_timeout=5)
    with pytest.raises(HostKeyChangedError, match="HOST KEY CHANGED"):
        fresh.run("true")
    assert not kept.alive() and elsewhere.alive()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def _hosts(sshd: Sshd, tmp_path: Path, known_hosts: Path) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(f"version: 1\nhosts:\n  box:\n    address: 127.0.0.1\n    port: {sshd.port}\n"
                    f"    known_hosts: {known_hosts}\n")
    return path


def test_hosts_trust_of_a_changed_key_shows_both_and_ends_masters(
        sshd: Sshd, tmp_path: Path) -> None:
    good, changed, _ = _files(sshd, tmp_path)
    kept = _kept(sshd, good)
    before = changed.read_text()
    done = _cli("--hosts", str(_hosts(sshd, tmp_path, changed)), "hosts", "trust", "box", "--yes")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "HOST KEY CHANGED" in done.stderr
    assert openssh_fingerprint(sshd.host_key.with_suffix(".pub")) in done.stderr
    assert openssh_fingerprint(tmp_path / "old.pub") in done.stderr
    assert changed.read_text() == before and not kept.alive()


def test_hosts_trust_records_the_port_form_beside_a_portless_line(
        sshd: Sshd, tmp_path: Path) -> None:
    keytype, b64 = sshd.host_key.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"127.0.0.1 {keytype} {b64}\n")
    done = _cli("--hosts", str(_hosts(sshd, tmp_path, known)), "hosts", "trust", "box", "--yes")
    assert done.returncode == 0, done.stderr
    assert known.read_text().splitlines() == [f"127.0.0.1 {keytype} {b64}",
                                              f"[127.0.0.1]:{sshd.port} {keytype} {b64}"]
    assert _kept(sshd, known).run("echo in").stdout == "in\n"
    ssh = SshTransport("127.0.0.1", known_hosts=known, port=sshd.port, user="root",
                       identity_file=sshd.client_key, load_ssh_config=False, connect_timeout=5)
    with ssh:
        assert ssh.run("echo in").stdout == "in\n"


def test_both_paths_offer_the_same_host_key_algorithms() -> None:
    """The order both offer is paramiko's own, and the OpenSSH client knows every one."""
    left, right = socket.socketpair()
    try:
        offered = paramiko.Transport(left).get_security_options().key_types
    finally:
        left.close()
        right.close()
    assert [a for a in offered if a in HOST_KEY_ALGORITHMS] == list(HOST_KEY_ALGORITHMS)
    known = subprocess.run(["ssh", "-Q", "HostKeyAlgorithms"], capture_output=True, text=True,
                           check=True).stdout.split()
    assert set(HOST_KEY_ALGORITHMS) <= set(known)


def test_the_pinned_file_holds_what_check_accepts(tmp_path: Path) -> None:
    """Written for ssh: this host's keys under the alias, every revoked key, nothing else."""
    a = keygen(tmp_path / "a").with_suffix(".pub").read_text().split()[:2]
    b = keygen(tmp_path / "b").with_suffix(".pub").read_text().split()[:2]
    c = keygen(tmp_path / "c").with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[h.example]:2222 {' '.join(a)}\nh.example {' '.join(b)}\n"
                     f"@revoked other.example {' '.join(c)}\n"
                     f"@cert-authority * {' '.join(b)}\n")
    text = KnownHosts(known).pinned_text("h.example", 2222).splitlines()
    assert text == ["# ddtree-deploy pinned keys of [h.example]:2222",
                    f"ddtree-deploy-pinned {' '.join(a)}", f"@revoked * {' '.join(c)}"]
    assert KnownHosts(known).pinned_text("h.example", 22).splitlines()[1:] == [
        f"ddtree-deploy-pinned {' '.join(b)}", f"@revoked * {' '.join(c)}"]


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_an_ssh_config_alias_is_looked_up_by_its_hostname_and_port(
        sshd: Sshd, tmp_path: Path, transport: str) -> None:
    """Both paths read the alias's HostName and Port (OpenSSH through `ssh -G`) and judge the
    key recorded for [HostName]:Port, never for the alias's own name."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host boxalias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n"
                   f"  IdentityFile {sshd.client_key}\n  IdentitiesOnly yes\n")
    key = " ".join(sshd.host_key.with_suffix(".pub").read_text().split()[:2])
    files = {}
    for name, line in {"right": f"[127.0.0.1]:{sshd.port} {key}", "portless": f"127.0.0.1 {key}",
                       "by-alias": f"[boxalias]:{sshd.port} {key}"}.items():
        files[name] = tmp_path / name
        files[name].write_text(line + "\n")

    def run(known_hosts: Path) -> str:
        t: OpenSshTransport | SshTransport
        if transport == "openssh":
            t = OpenSshTransport("boxalias", known_hosts=known_hosts, ssh_config=cfg,
                                 connect_timeout=5, persist=5, name="box")
        else:
            t = SshTransport("boxalias", known_hosts=known_hosts, ssh_config=cfg,
                             connect_timeout=5, name="box")
        try:
            return t.run("echo in").stdout
        finally:
            if isinstance(t, OpenSshTransport):
                t.disconnect()
            t.close()

    assert run(files["right"]) == "in\n"
    with pytest.raises(HostKeyError) as info:
        run(files["portless"])
    assert f"must be recorded as [127.0.0.1]:{sshd.port}" in str(info.value)
    with pytest.raises(HostKeyError, match="is not known"):
        run(files["by-alias"])


def test_hosts_trust_of_a_web_server_is_one_clean_message(tmp_path: Path) -> None:
    """A web server on the port: one message, no paramiko thread traceback on stderr."""
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from threading import Thread

    class Quiet(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Quiet)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        done = _cli("--hosts", str(tmp_path / "none.yaml"), "hosts", "trust",
                    f"127.0.0.1:{server.server_address[1]}", "--yes", "--timeout", "5")
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 1
    assert "without an SSH banner" in done.stderr
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr
    assert not (tmp_path / "none.yaml").exists()
