"""OpenSshTransport (facts' reads over an OpenSSH master kept open) against a real sshd."""

from __future__ import annotations

import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S, call_guarded, kill_left, running, wait_none_running
from sshd_fixture import Sshd, free_port, keygen, openssh_fingerprint

from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.errors import AuthError, CommandTimeout, HostKeyError, UnreachableError
from ddtree_deploy.transport import Command, SshTransport, openssh
from ddtree_deploy.transport.connect import open_transport
from ddtree_deploy.transport.openssh import OpenSshTransport, map_ssh_error

pytestmark = [pytest.mark.sshd, pytest.mark.usefixtures("openssh_control"),
              pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")]



@pytest.fixture
def known(sshd: Sshd, tmp_path: Path) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(sshd.known_hosts_line() + "\n")
    return path


def connect(sshd: Sshd, known_hosts: Path, **kwargs: object) -> OpenSshTransport:
    options: dict[str, object] = {"port": sshd.port, "user": "root", "connect_timeout": 5,
                                  "identity_file": sshd.client_key, "persist": 30}
    options.update(kwargs)
    return OpenSshTransport("127.0.0.1", known_hosts=known_hosts, **options)  # type: ignore[arg-type]


def test_commands_and_a_master_kept_between_objects(sshd: Sshd, known: Path) -> None:
    first = connect(sshd, known, name="ct-test")
    assert not first.alive()
    r = first.run(Command.shell('echo "o $1"; echo e >&2; exit 5', "arg"))
    assert (r.exit_code, r.stdout, r.stderr, r.host) == (5, "o arg\n", "e\n", "ct-test")
    first.close()
    later = connect(sshd, known)  # another run of the tool, same settings: the same master
    assert later.alive() and later.control_path == first.control_path
    assert later.run(Command(("id", "-u"))).check().stdout == "0\n"
    other_key = connect(sshd, known, identity_file=keygen(Path(tempfile.mkdtemp()) / "k"))
    assert other_key.control_path != first.control_path  # other settings: never shared
    assert later.disconnect() and not later.alive()


def test_exit_255_of_a_command_is_its_own(sshd: Sshd, known: Path) -> None:
    t = connect(sshd, known)
    assert t.run("exit 255").exit_code == 255
    assert t.alive() and t.run("echo fine").stdout == "fine\n"


def test_a_master_that_went_away_is_started_again(sshd: Sshd, known: Path) -> None:
    t = connect(sshd, known)
    t.run("true").check()
    assert t.disconnect()
    assert t.run("echo on").stdout == "on\n"  # this run starts a new master
    again = connect(sshd, known)
    assert again.run("echo back").stdout == "back\n" and again.alive()


def test_streams_and_timeouts(sshd: Sshd, known: Path, tmp_path: Path) -> None:
    t = connect(sshd, known)
    blob = os.urandom(3 << 20)
    assert t.put_stream(io.BytesIO(blob), str(tmp_path / "blob")) == len(blob)
    back = io.BytesIO()
    t.get_stream(str(tmp_path / "blob"), back)
    assert back.getvalue() == blob
    r = t.run(Command(("cat",), stdin=b"\x00~.\n~C binary"))  # no escape characters
    assert r.stdout == "\x00~.\n~C binary"
    token = f"{600 + random.random():.6f}"  # sleeps far past the test's hang guard
    try:
        with pytest.raises(CommandTimeout, match="within 1s"):
            call_guarded(lambda: t.run(f"sleep {token}", timeout=1), "run")
        wait_none_running(f"sleep {token}", "the timed-out remote command")
        assert t.run("echo still").stdout == "still\n"
        # TERM ignored: killed with its group, an exit-signal (ssh: 255)
        with pytest.raises(CommandTimeout, match="within 1s"):
            call_guarded(lambda: t.run(Command.shell(f"trap '' TERM; sleep {token}"),
                                       timeout=1), "run")
        wait_none_running(f"sleep {token}", "the remote command ignoring TERM")
    finally:
        kill_left(running(f"sleep {token}"))


def test_connect_errors_are_mapped(sshd: Sshd, known: Path, tmp_path: Path) -> None:
    port = free_port()
    refused = connect(sshd, known, port=port, name="ct200", connect_timeout=600)
    with pytest.raises(UnreachableError, match="unreachable: .*Connection refused"):
        # reported from the refusal itself: the 600 s connect timeout is never waited out
        call_guarded(lambda: refused.run("true"), "connecting to a closed port")
    with pytest.raises(AuthError, match="authentication"):
        connect(sshd, known, identity_file=keygen(tmp_path / "other")).run("true")
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError, match="not known") as unknown:
        connect(sshd, empty, name="ct200").run("true")
    assert "ddtree-deploy hosts trust ct200" in str(unknown.value)
    assert empty.read_text() == ""  # nothing added on the fly
    old = keygen(tmp_path / "old_host_key")
    changed = tmp_path / "changed"
    keytype, b64 = old.with_suffix(".pub").read_text().split()[:2]
    changed.write_text(f"[127.0.0.1]:{sshd.port} {keytype} {b64}\n")
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED") as info:
        connect(sshd, changed).run("true")
    assert openssh_fingerprint(sshd.host_key.with_suffix(".pub")) in str(info.value)
    revoked = tmp_path / "revoked"
    pub = sshd.host_key.with_suffix(".pub").read_text().strip()
    revoked.write_text(sshd.known_hosts_line() + f"\n@revoked * {pub}\n")
    with pytest.raises(HostKeyError, match="revoked"):
        connect(sshd, revoked).run("true")


def test_unmatched_ssh_text_is_a_transport_error() -> None:
    err = map_ssh_error("ct1", "ct1 (a:22)", "ssh: weird failure\n", Path("/kh"), 5)
    assert type(err).__name__ == "TransportError" and "weird failure" in str(err)


def _hosts_file(sshd: Sshd, known: Path, tmp_path: Path, persist: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(
        "version: 1\nhosts:\n  box:\n    address: 127.0.0.1\n"
        f"    port: {sshd.port}\n    identity_file: {sshd.client_key}\n"
        f"    known_hosts: {known}\n    connect_timeout: 5\n{persist}")
    return path


def test_facts_use_it_where_the_host_allows(sshd: Sshd, known: Path, tmp_path: Path) -> None:
    config = load_config(_hosts_file(sshd, known, tmp_path, ""))
    assert isinstance(open_transport(config, "box", reuse=True), OpenSshTransport)
    assert isinstance(open_transport(config, "box"), SshTransport)  # changes: paramiko
    off = load_config(_hosts_file(sshd, known, tmp_path, "    ssh_persist: 0\n"))
    assert isinstance(open_transport(off, "box", reuse=True), SshTransport)


def test_inventory_returns_while_the_master_stays(sshd: Sshd, known: Path,
                                                 tmp_path: Path) -> None:
    """The master outlives the command, but must not hold the command's output pipes open:
    a caller reading them to the end gets them at once. `hosts disconnect` ends it."""
    hosts = _hosts_file(sshd, known, tmp_path, "    ssh_persist: 600\n")
    cli = [sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts)]
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    try:  # a master holding the pipes would hold them its 600 s, past the hang guard
        done = subprocess.run([*cli, "inventory", "--refresh", "--json"], capture_output=True,
                              env=env, timeout=HANG_GUARD_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang guard: inventory's output still open after {HANG_GUARD_S:g}s: "
                    "the master holds the command's pipes")
    assert done.returncode == 0, done.stderr.decode()
    assert b'"host": "box"' in done.stdout
    config = load_config(hosts)
    kept = open_transport(config, "box", reuse=True)
    assert isinstance(kept, OpenSshTransport) and kept.alive()
    ended = subprocess.run([*cli, "hosts", "disconnect"], capture_output=True, env=env,
                           timeout=30, check=False)
    assert ended.returncode == 0 and b"box: connection ended" in ended.stdout
    assert not kept.alive()


def test_hosts_disconnect_of_nothing(sshd: Sshd, known: Path, tmp_path: Path) -> None:
    hosts = _hosts_file(sshd, known, tmp_path, "")
    done = subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts),
                           "hosts", "disconnect", "box"], capture_output=True, timeout=30,
                          check=False)
    assert done.returncode == 0 and b"box: no kept connection" in done.stdout


def test_negative_persist_is_a_config_error(sshd: Sshd, known: Path, tmp_path: Path) -> None:
    hosts = _hosts_file(sshd, known, tmp_path, "    ssh_persist: -1\n")
    done = subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts),
                           "hosts", "list"], capture_output=True, timeout=30, check=False)
    text = done.stderr.decode() + done.stdout.decode()
    assert done.returncode == 2 and "ssh_persist" in text and "0 to 604800, got -1" in text
    assert "Traceback" not in text


def test_a_killed_master_leaves_a_socket_that_is_replaced(sshd: Sshd, known: Path) -> None:
    import signal

    t = connect(sshd, known)
    t.run("true").check()
    found = subprocess.run(["ssh", "-F", "none", "-S", str(t.control_path), "-O", "check", "x"],
                           capture_output=True, text=True, check=False)
    pid = int(found.stderr.split("pid=")[1].split(")")[0])
    os.kill(pid, signal.SIGKILL)  # the socket file stays behind, nobody listening
    time.sleep(0.2)
    assert t.control_path.exists() and not t.alive()
    assert t.run("echo again").stdout == "again\n"  # ssh removes the stale socket itself
    assert t.alive()


def test_control_folder_short_enough_or_paramiko(sshd: Sshd, known: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))  # too long for a socket path
    folder = openssh.control_dir()
    assert not str(folder).startswith(str(deep))
    assert len(str(folder)) + 24 <= openssh.SOCKET_PATH_MAX
    assert connect(sshd, known).run("echo short").stdout == "short\n"

    def no_folder(create: bool = True) -> Path:
        raise openssh.TransportError("no folder")

    config = load_config(_hosts_file(sshd, known, tmp_path, ""))
    with monkeypatch.context() as patch:
        patch.setattr(openssh, "control_dir", no_folder)
        assert isinstance(open_transport(config, "box", reuse=True), SshTransport)
