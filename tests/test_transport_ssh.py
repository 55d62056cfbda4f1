"""SshTransport against a real OpenSSH sshd on loopback (see sshd_fixture.py)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import random
import socket
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S, call_guarded, kill_left, running, wait_none_running
from sshd_fixture import Sshd, free_port, keygen, openssh_fingerprint

from ddtree_deploy.errors import (
    AuthError,
    CommandTimeout,
    HostKeyError,
    SudoError,
    TransportError,
    UnreachableError,
)
from ddtree_deploy.transport import (
    Command,
    KnownHosts,
    SshTransport,
    Transport,
    fingerprint,
    sftp_upload,
    trust_host,
)
from ddtree_deploy.transport.ssh import Uploader

pytestmark = pytest.mark.sshd


@pytest.fixture
def known(sshd: Sshd, tmp_path: Path) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(sshd.known_hosts_line() + "\n")
    return path


def connect(sshd: Sshd, known_hosts: Path, **kwargs: object) -> SshTransport:
    options: dict[str, object] = {
        "port": sshd.port,
        "user": "root",
        "identity_file": sshd.client_key,
        "load_ssh_config": False,
        "connect_timeout": 5,
    }
    options.update(kwargs)
    return SshTransport("127.0.0.1", known_hosts=known_hosts, **options)  # type: ignore[arg-type]


class Seen(io.BytesIO):
    """A command's standard output as it comes; `ready` once it has printed READY."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = threading.Event()

    def write(self, data: bytes) -> int:  # type: ignore[override]
        n = super().write(data)
        if b"READY" in self.getvalue():
            self.ready.set()
        return n


# -- commands -------------------------------------------------------------------


def test_run_exit_codes_streams_duration(sshd: Sshd, known: Path) -> None:
    with connect(sshd, known, name="ct-test") as t:
        assert isinstance(t, Transport)
        before = time.monotonic()
        r = t.run(Command.shell('echo "o $1"; echo e >&2; sleep 0.3; exit 5', "arg"))
        around = time.monotonic() - before
        assert (r.exit_code, r.stdout, r.stderr, r.host) == (5, "o arg\n", "e\n", "ct-test")
        assert 0.3 <= r.duration <= around  # in seconds, of this run: at least its sleep
        assert t.run(Command(("id", "-u"))).check().stdout == "0\n"
        assert t.run("exit 0").ok


def test_many_commands_reuse_one_connection(sshd: Sshd, known: Path) -> None:
    with connect(sshd, known) as t:
        outputs = [t.run(Command(("echo", str(i)))).stdout for i in range(20)]
    assert outputs == [f"{i}\n" for i in range(20)]


def test_no_nagle_delay_on_the_connection(sshd: Sshd, known: Path) -> None:
    # Nagle plus the peer's delayed ACK would hold each command's last packet for ~40 ms.
    with connect(sshd, known) as t:
        t.run("true").check()
        sock = t._ensure().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_held_command_and_others_share_the_connection(sshd: Sshd, known: Path) -> None:
    """What apply's lock relies on: a command holding its channel (reporting through a stream
    as it goes) while other commands run on the same connection, released by its stdin."""
    release = threading.Event()

    class Stdin:
        def read(self, size: int = -1) -> bytes:
            release.wait(10)
            return b""

    seen = Seen()
    with connect(sshd, known) as t:
        holder = threading.Thread(target=lambda: t.run_piped(
            "echo READY; cat >/dev/null; echo DONE", Stdin(), seen, timeout=30))  # type: ignore[arg-type]
        holder.start()
        assert seen.ready.wait(10)
        assert [t.run(Command(("echo", str(i)))).stdout for i in range(3)] == ["0\n", "1\n", "2\n"]
        assert b"DONE" not in seen.getvalue()
        release.set()
        holder.join(10)
    assert seen.getvalue() == b"READY\nDONE\n"


def test_a_refused_session_leaves_the_connection_and_close_is_final(tmp_path: Path) -> None:
    server = Sshd(tmp_path / "sshd", max_sessions=1)
    server.start()
    try:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(server.known_hosts_line() + "\n")
        release = threading.Event()

        class Stdin:
            def read(self, size: int = -1) -> bytes:
                release.wait(10)
                return b""

        t = connect(server, known_hosts)
        t.run("true").check()
        first = t._ensure()
        seen = Seen()

        def hold() -> None:  # sshd may not have freed run("true")'s slot yet: wait for it
            for _ in range(600):
                try:
                    t.run_piped("echo READY; cat >/dev/null", Stdin(), seen,  # type: ignore[arg-type]
                                timeout=30)
                    return
                except TransportError as exc:
                    if "refused a session" not in str(exc):
                        raise
                    time.sleep(0.05)

        holder = threading.Thread(target=hold)
        holder.start()
        assert seen.ready.wait(40)  # the one session the server allows is taken
        with pytest.raises(TransportError, match="refused a session"):
            t.run("true")
        release.set()
        holder.join(60)
        assert not holder.is_alive() and seen.getvalue() == b"READY\n"
        # sshd frees the session slot a moment after the channel closes: until then it refuses
        # again, on the same connection (each refusal is the behaviour under test, not a failure)
        for _ in range(200):
            try:
                again = t.run("echo again")
                break
            except TransportError as exc:
                assert "refused a session" in str(exc)
                time.sleep(0.05)
        else:
            pytest.fail("sshd never freed the session slot after the holder's channel closed")
        assert again.stdout == "again\n"
        assert t._ensure() is first  # the same connection: the refusals did not close it
        t.close()
        with pytest.raises(TransportError, match="closed"):
            t.run("true")  # never silently reconnects once closed (e.g. from a thread)
    finally:
        server.stop()


def test_large_output_does_not_deadlock(sshd: Sshd, known: Path) -> None:
    with connect(sshd, known) as t:
        r = t.run("head -c 5000000 /dev/zero; head -c 3000000 /dev/zero >&2", timeout=60)
    assert len(r.stdout) == 5_000_000 and len(r.stderr) == 3_000_000


def test_timeout_kills_the_remote_command(sshd: Sshd, known: Path) -> None:
    token = f"{600 + random.random():.6f}"  # a sleep far past the test's hang guard
    try:
        with connect(sshd, known) as t:
            with pytest.raises(CommandTimeout, match="within 1s") as info:
                call_guarded(lambda: t.run(
                    Command.shell(f"sleep {token} & sleep {token}; wait"), timeout=1), "run")
            assert info.value.exit_code == 124
            wait_none_running(f"sleep {token}", "the timed-out remote command")
            assert t.run("echo still usable").stdout == "still usable\n"
    finally:
        kill_left(running(f"sleep {token}"))


def test_timeout_kills_a_command_ignoring_term(sshd: Sshd, known: Path) -> None:
    token = f"{600 + random.random():.6f}"
    try:
        with connect(sshd, known) as t, pytest.raises(CommandTimeout, match="within 0.5s"):
            call_guarded(lambda: t.run(
                Command.shell(f"trap '' TERM; sleep {token}"), timeout=0.5), "run")
        wait_none_running(f"sleep {token}", "the remote command ignoring TERM")
    finally:
        kill_left(running(f"sleep {token}"))


# -- reachability ---------------------------------------------------------------


def test_closed_port_is_unreachable_fast(tmp_path: Path) -> None:
    """A refusal is reported as one at once, never waited out: with a connect timeout far
    past the hang guard, only an answer taken from the refusal itself returns."""
    port = free_port()
    t = SshTransport(
        "127.0.0.1", port=port, known_hosts=tmp_path / "kh", connect_timeout=600, name="ct200"
    )
    with pytest.raises(UnreachableError, match=rf"ct200 \(127.0.0.1:{port}\) unreachable: "
                                               "connection refused"):
        call_guarded(lambda: t.run("true"), "connecting to a closed port")


def test_silent_connect_times_out_within_bound(tmp_path: Path) -> None:
    # A listener whose accept queue is full: further SYNs are dropped and connect hangs.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    time.sleep(0.1)
    try:
        t = SshTransport("127.0.0.1", port=port, known_hosts=tmp_path / "kh", connect_timeout=1.5)
        start = time.monotonic()
        with pytest.raises(UnreachableError, match=r"within 1.5s") as info:
            call_guarded(lambda: t.run("true"), "connecting to a silent port")
        assert time.monotonic() - start > 1.0  # it waited its timeout out (a lower bound)
        # our 1.5 s ended it (a socket timeout, no errno), not the kernel's own SYN retries
        # (about 2 min, ETIMEDOUT): the bound is the one configured
        cause = info.value.__cause__
        assert isinstance(cause, TimeoutError) and cause.errno is None, repr(cause)
    finally:
        for s in fillers:
            s.close()
        server.close()


def test_server_without_banner_is_unreachable_within_bound(tmp_path: Path) -> None:
    """A server that accepts but never speaks: the connect timeout bounds the wait for its
    banner. Shown without a clock: a connection given 1 s gives up while one given 600 s,
    begun first on the same server, still waits; that one ends when the server hangs up."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    port = server.getsockname()[1]
    held: list[socket.socket] = []
    accepted = threading.Semaphore(0)

    def accept_all() -> None:
        with contextlib.suppress(OSError):  # the server closed: done
            while True:
                held.append(server.accept()[0])
                accepted.release()

    accepter = threading.Thread(target=accept_all, daemon=True)
    accepter.start()
    patient = SshTransport("127.0.0.1", port=port, known_hosts=tmp_path / "kh",
                           connect_timeout=600)
    patient_error: list[BaseException] = []

    def wait_patiently() -> None:
        try:
            patient.run("true")
        except BaseException as exc:  # examined below
            patient_error.append(exc)

    waiter = threading.Thread(target=wait_patiently, daemon=True)
    try:
        waiter.start()
        assert accepted.acquire(timeout=HANG_GUARD_S), "hang guard: the server saw no connection"
        # Were a fixed default used for both, the first would end a second before this one.
        time.sleep(1)
        t = SshTransport("127.0.0.1", port=port, known_hosts=tmp_path / "kh", connect_timeout=1)
        with pytest.raises(UnreachableError, match="no SSH banner within 1s"):
            call_guarded(lambda: t.run("true"), "connecting to a server without a banner")
        assert waiter.is_alive() and not patient_error, patient_error
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        server.close()
        for s in held:
            s.close()
        waiter.join(HANG_GUARD_S)
        accepter.join(HANG_GUARD_S)
    assert not waiter.is_alive(), "hang guard: the 600 s connection outlived its server"
    assert len(patient_error) == 1 and isinstance(patient_error[0], UnreachableError)
    assert "closed the connection without an SSH banner" in str(patient_error[0])


def test_wrong_client_key_is_an_auth_error(sshd: Sshd, known: Path, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_key")
    with pytest.raises(AuthError, match="authentication as root@127.0.0.1"):
        connect(sshd, known, identity_file=other).run("true")


# -- host keys ------------------------------------------------------------------


def test_unknown_host_key_is_refused_with_trust_hint(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError) as info:
        connect(sshd, empty, name="ct200").run("true")
    text = str(info.value)
    assert "ddtree-deploy hosts trust ct200" in text
    assert openssh_fingerprint(sshd.host_key.with_suffix(".pub")) in text
    assert empty.read_text() == ""  # nothing was added on the fly


def test_changed_host_key_is_refused_with_both_fingerprints(sshd: Sshd, tmp_path: Path) -> None:
    old = keygen(tmp_path / "old_host_key")
    kh = tmp_path / "known_hosts"
    keytype, b64 = old.with_suffix(".pub").read_text().split()[:2]
    kh.write_text(f"[127.0.0.1]:{sshd.port} {keytype} {b64}\n")
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED") as info:
        connect(sshd, kh).run("true")
    text = str(info.value)
    assert openssh_fingerprint(old.with_suffix(".pub")) in text
    assert openssh_fingerprint(sshd.host_key.with_suffix(".pub")) in text


def test_cert_authority_revoked_and_hashed_lines(sshd: Sshd, tmp_path: Path) -> None:
    ca = keygen(tmp_path / "ca")
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "# comment\n\n"
        f"@cert-authority *.example {ca.with_suffix('.pub').read_text().strip()}\n"
        "garbage-line\n" + sshd.known_hosts_line() + "\n"
    )
    with connect(sshd, kh) as t:
        assert t.run("echo ok").stdout == "ok\n"
    # ssh-keygen -H hashes the host names; the hashed file must still match.
    hashed = tmp_path / "hashed_known_hosts"
    hashed.write_text(sshd.known_hosts_line() + "\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert "|1|" in hashed.read_text() and "127.0.0.1" not in hashed.read_text()
    with connect(sshd, hashed) as t:
        assert t.run("echo ok").ok
    pub = sshd.host_key.with_suffix(".pub").read_text().strip()
    with kh.open("a") as fh:
        fh.write(f"@revoked * {pub}\n")
    with pytest.raises(HostKeyError, match="revoked"):
        connect(sshd, kh).run("true")


def test_trust_records_the_key_then_connects(sshd: Sshd, tmp_path: Path) -> None:
    kh = tmp_path / "cfg" / "known_hosts"
    asked: list[str] = []

    def no(question: str) -> bool:
        asked.append(question)
        return False

    declined = trust_host("127.0.0.1", sshd.port, kh, confirm=no, timeout=5)
    assert declined.status == "declined" and not kh.exists()
    expected_fp = openssh_fingerprint(sshd.host_key.with_suffix(".pub"))
    assert expected_fp in asked[0] and "ssh-ed25519" in asked[0]
    added = trust_host("127.0.0.1", sshd.port, kh, confirm=lambda q: True, timeout=5)
    assert (added.status, added.fingerprint) == ("added", expected_fp)
    assert kh.read_text() == sshd.known_hosts_line() + "\n"
    assert kh.stat().st_mode & 0o777 == 0o600
    with connect(sshd, kh) as t:
        assert t.run("echo in").stdout == "in\n"
    again = trust_host("127.0.0.1", sshd.port, kh, confirm=no, timeout=5)
    assert again.status == "already-known" and len(asked) == 1


def test_trust_refuses_a_changed_key(sshd: Sshd, tmp_path: Path) -> None:
    old = keygen(tmp_path / "old")
    keytype, blob = old.with_suffix(".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {keytype} {blob}\n")
    with pytest.raises(HostKeyError) as info:
        trust_host("127.0.0.1", sshd.port, kh, confirm=lambda q: True, timeout=5)
    assert fingerprint(base64.b64decode(blob)) in str(info.value)
    assert openssh_fingerprint(sshd.host_key.with_suffix(".pub")) in str(info.value)
    assert len(kh.read_text().splitlines()) == 1


def cli(*args: str, input_text: str = "") -> subprocess.CompletedProcess[str]:
    """The real console entry point, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "ddtree_deploy.cli", *args],
        input=input_text, capture_output=True, text=True, timeout=60, check=False,
    )


def test_hosts_trust_cli(sshd: Sshd, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        "version: 1\nhosts:\n  ct200:\n    address: 127.0.0.1\n"
        f"    port: {sshd.port}\n    known_hosts: {kh}\n"
    )
    refused = cli("--hosts", str(hosts), "hosts", "trust", "ct200", input_text="n\n")
    assert refused.returncode == 1 and not kh.exists()
    assert "NOT recorded" in refused.stderr
    ok = cli("--hosts", str(hosts), "hosts", "trust", "ct200", "--yes")
    assert ok.returncode == 0, ok.stderr
    assert openssh_fingerprint(sshd.host_key.with_suffix(".pub")) in ok.stdout
    assert KnownHosts(kh).lookup("127.0.0.1", sshd.port)
    again = cli("--hosts", str(hosts), "hosts", "trust", "ct200")
    assert again.returncode == 0 and "already known" in again.stdout


def test_hosts_trust_cli_unreachable_is_a_message(tmp_path: Path) -> None:
    port = free_port()
    result = cli("--hosts", str(tmp_path / "none.yaml"), "hosts", "trust",
                 f"127.0.0.1:{port}", "--timeout", "2")
    assert result.returncode == 1
    assert "unreachable" in result.stderr and "Traceback" not in result.stderr


def test_hosts_trust_cli_bad_address_is_a_usage_message(tmp_path: Path) -> None:
    result = cli("--hosts", str(tmp_path / "none.yaml"), "hosts", "trust", "127.0.0.1:99999")
    assert result.returncode == 2
    assert "not a TCP port" in result.stderr and "Traceback" not in result.stderr


def test_trust_scan_of_a_silent_server_is_unreachable(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    port = server.getsockname()[1]
    try:
        with pytest.raises(UnreachableError, match="no SSH banner"):
            trust_host("127.0.0.1", port, tmp_path / "kh", confirm=lambda q: True, timeout=1)
    finally:
        server.close()
    assert not (tmp_path / "kh").exists()


# -- files and tar pipes --------------------------------------------------------


@pytest.mark.parametrize("uploader", [None, sftp_upload], ids=["exec-cat", "sftp"])
def test_put_and_get_multi_megabyte(
    sshd: Sshd, known: Path, tmp_path: Path, uploader: Uploader | None
) -> None:
    data = os.urandom(12 * 1024 * 1024 + 7)
    target = tmp_path / "remote dir" / "blob.bin"
    target.parent.mkdir()
    with connect(sshd, known, uploader=uploader) as t:
        assert t.put_stream(io.BytesIO(data), str(target), mode=0o755) == len(data)
        assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest()
        assert target.stat().st_mode & 0o777 == 0o755
        assert [p.name for p in target.parent.iterdir()] == ["blob.bin"]
        out = io.BytesIO()
        assert t.get_stream(str(target), out) == len(data)
    assert hashlib.sha256(out.getvalue()).digest() == hashlib.sha256(data).digest()


def test_tar_in_and_out(sshd: Sshd, known: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (src / "nvidia" / "cu13" / "lib" / "libcudart.so.13").write_bytes(os.urandom(2_000_000))
    (src / "odd $(name) `x`").write_text("v")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(src, arcname=".")
    buf.seek(0)
    dest = tmp_path / "dest"
    dest.mkdir()
    with connect(sshd, known) as t:
        t.run_stream_in(Command(("tar", "-x", "-f", "-", "-C", str(dest))), buf).check()
        out = io.BytesIO()
        t.run_stream_out(Command(("tar", "-c", "-f", "-", "-C", str(dest), ".")), out).check()
    out.seek(0)
    back = tmp_path / "back"
    with tarfile.open(fileobj=out) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(back, filter="data")
        else:  # Debian 12's Python (3.11.2, as in CI) predates extraction filters
            tar.extractall(back)
    for root in (dest, back):
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        assert files == ["nvidia/cu13/lib/libcudart.so.13", "odd $(name) `x`"]
        lib = root / "nvidia/cu13/lib/libcudart.so.13"
        assert lib.read_bytes() == (src / "nvidia/cu13/lib/libcudart.so.13").read_bytes()


# -- gateways, ssh config, sudo -------------------------------------------------


def test_jump_host(sshd: Sshd, known: Path) -> None:
    with (
        connect(sshd, known, name="jump") as jump,
        connect(sshd, known, jump=jump, name="inner") as inner,
    ):
        assert inner.run(Command(("echo", "via jump"))).stdout == "via jump\n"
        assert jump.run("echo direct").stdout == "direct\n"


def test_ssh_config_alias(sshd: Sshd, known: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host ct-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n"
        f"  IdentityFile {sshd.client_key}\n"
    )
    with SshTransport("ct-alias", known_hosts=known, ssh_config=cfg) as t:
        assert (t.address, t.port, t.user) == ("127.0.0.1", sshd.port, "root")
        assert t.run("echo alias").stdout == "alias\n"


def test_non_root_user_sudo_errors(sshd: Sshd, known: Path, tmp_path: Path) -> None:
    name = f"ddt{uuid.uuid4().hex[:8]}"
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    home = sshd.add_user(name, path_dirs=["/usr/bin", "/bin"])
    with connect(sshd, known, user=name) as t:
        assert t.run(Command(("id", "-un"))).stdout == f"{name}\n"
        assert t.run(Command(("true",), sudo=False)).ok
        if not os.access("/usr/bin/sudo", os.X_OK):
            with pytest.raises(SudoError, match="not installed"):
                t.run(Command(("true",), sudo=True))
    # Stand-in sudo that refuses like sudo -n does without NOPASSWD.
    fake = home / "bin"
    fake.mkdir()
    (fake / "sudo").write_text('#!/bin/sh\necho "sudo: a password is required" >&2\nexit 1\n')
    (fake / "sudo").chmod(0o755)
    (home / ".ssh" / "environment").write_text(f"PATH={fake}:/usr/bin:/bin\n")
    with connect(sshd, known, user=name) as t, pytest.raises(SudoError, match="password"):
        t.run(Command(("systemctl", "restart", "x"), sudo=True))
