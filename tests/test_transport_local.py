"""LocalTransport: the same semantics as SSH, checked on this machine."""

from __future__ import annotations

import hashlib
import io
import os
import random
import tarfile
import time
from pathlib import Path

import pytest
from hang_guard import call_guarded, kill_left, running, wait_none_running

from ddtree_deploy.errors import CommandTimeout, ExitCode, RemoteCommandError, SudoError
from ddtree_deploy.transport import Command, LocalTransport, Transport


def test_local_is_a_transport() -> None:
    assert isinstance(LocalTransport(), Transport)


def test_run_reports_exit_code_streams_and_duration() -> None:
    with LocalTransport() as t:
        before = time.monotonic()
        result = t.run(Command.shell('echo out; echo "err $1" >&2; sleep 0.2; exit 7', "x"))
        around = time.monotonic() - before
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err x\n")
    assert not result.ok
    assert 0.2 <= result.duration <= around  # in seconds, of this run: at least its sleep
    assert result.host == "localhost"
    with pytest.raises(RemoteCommandError, match="exited 7") as info:
        result.check()
    assert "err x" in str(info.value)


def test_raw_string_runs_as_shell_line() -> None:
    result = LocalTransport().run("echo a | tr a b")
    assert result.ok and result.stdout == "b\n" and result.command == "echo a | tr a b"


def test_undecodable_output_is_replaced_not_fatal() -> None:
    result = LocalTransport().run(Command(("printf", "\\377ok")))
    assert result.stdout == "\ufffdok"


def test_missing_program_gives_127() -> None:
    result = LocalTransport().run(Command(("ddtree-no-such-program-xyz",)))
    assert result.exit_code == 127


def test_timeout_kills_the_process_group_and_raises() -> None:
    token = f"{600 + random.random():.6f}"  # a sleep far past the test's hang guard
    try:
        with pytest.raises(CommandTimeout) as info:
            # A grandchild (the backgrounded sleep) must die too.
            call_guarded(lambda: LocalTransport().run(
                Command.shell(f"sleep {token} & sleep {token}; wait"), timeout=1), "run")
        assert info.value.exit_code == ExitCode.DEADLINE == 124
        assert "within 1s" in str(info.value)
        wait_none_running(f"sleep {token}", "the timed-out command")
    finally:
        kill_left(running(f"sleep {token}"))


def test_timeout_also_kills_commands_ignoring_term() -> None:
    token = f"{600 + random.random():.6f}"
    try:
        with pytest.raises(CommandTimeout, match="within 0.5s"):
            call_guarded(lambda: LocalTransport().run(
                Command.shell(f"trap '' TERM; sleep {token}"), timeout=0.5), "run")
        wait_none_running(f"sleep {token}", "the command ignoring TERM")
    finally:
        kill_left(running(f"sleep {token}"))


def test_a_command_exiting_124_by_itself_is_not_a_timeout() -> None:
    assert LocalTransport().run("exit 124", timeout=30).exit_code == 124


def test_put_and_get_stream_a_multi_megabyte_file(tmp_path: Path) -> None:
    data = os.urandom(6 * 1024 * 1024 + 123)
    target = tmp_path / "sub dir" / "blob.bin"
    target.parent.mkdir()
    t = LocalTransport()
    assert t.put_stream(io.BytesIO(data), str(target), mode=0o640) == len(data)
    assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in target.parent.iterdir()) == ["blob.bin"]  # no temp left
    out = io.BytesIO()
    assert t.get_stream(str(target), out) == len(data)
    assert out.getvalue() == data


def test_put_stream_into_a_missing_folder_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(RemoteCommandError, match="could not write"):
        LocalTransport().put_stream(io.BytesIO(b"x"), str(tmp_path / "nope" / "f"))


def test_get_stream_of_a_missing_file_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(RemoteCommandError, match="could not read"):
        LocalTransport().get_stream(str(tmp_path / "missing"), io.BytesIO())


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_tar_pipes_in_and_out(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "lib" / "deep").mkdir(parents=True)
    (src / "lib" / "deep" / "libx.so").write_bytes(os.urandom(300_000))
    (src / "name with space;$(x)").write_text("hi")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(src, arcname=".")
    buf.seek(0)
    dest = tmp_path / "dest"
    dest.mkdir()
    t = LocalTransport()
    t.run_stream_in(Command(("tar", "-x", "-f", "-", "-C", str(dest))), buf).check()
    assert _tree(dest) == _tree(src)
    out = io.BytesIO()
    t.run_stream_out(Command(("tar", "-c", "-f", "-", "-C", str(dest), ".")), out).check()
    out.seek(0)
    back = tmp_path / "back"
    with tarfile.open(fileobj=out) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(back, filter="data")
        else:  # Debian 12's Python (3.11.2, as in CI) predates extraction filters
            tar.extractall(back)
    assert _tree(back) == _tree(src)


def test_stream_in_with_a_command_that_does_not_read() -> None:
    big = io.BytesIO(os.urandom(4 * 1024 * 1024))
    result = LocalTransport().run_stream_in(Command(("true",)), big, timeout=20)
    assert result.ok


@pytest.mark.skipif(os.geteuid() != 0, reason="checks that root skips sudo")
def test_sudo_flag_is_dropped_for_root() -> None:
    # sudo may not even be installed here: as root it is never invoked.
    result = LocalTransport().run(Command(("id", "-u"), sudo=True)).check()
    assert result.stdout.strip() == "0"


class _NonRootLocal(LocalTransport):
    def _is_root(self) -> bool:
        return False


def _fake_sudo(tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    sudo = bindir / "sudo"
    sudo.write_text("#!/bin/sh\n" + body + "\n")
    sudo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")


def test_sudo_password_prompt_becomes_sudo_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in with the real sudo's -n refusal text (sudo 1.9: exit 1).
    _fake_sudo(tmp_path, 'echo "sudo: a password is required" >&2; exit 1', monkeypatch)
    with pytest.raises(SudoError, match="password"):
        _NonRootLocal().run(Command(("systemctl", "daemon-reload"), sudo=True))


def test_sudo_runs_the_command_when_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_sudo(tmp_path, '[ "$1" = -n ] && [ "$2" = -- ] && shift 2 && exec "$@"', monkeypatch)
    result = _NonRootLocal().run(Command(("sh", "-c", "exit 3"), sudo=True))
    assert result.exit_code == 3  # the command's own failure is not a SudoError


def test_missing_sudo_becomes_sudo_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(SudoError, match="not installed"):
        _NonRootLocal().run(Command(("/bin/true",), sudo=True))
