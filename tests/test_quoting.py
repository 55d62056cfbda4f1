"""Command rendering: hostile values stay data, over the local and the SSH transport."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd_fixture import Sshd

from ddtree_deploy.errors import RemoteCommandError
from ddtree_deploy.transport import Command, LocalTransport, Result, SshTransport
from ddtree_deploy.transport.base import ExecTransport


def hostile(marks: Path) -> list[str]:
    """Values that would run `touch` if any layer interpolated them into shell code."""
    m = str(marks)
    return [
        f"; touch {m}/semi",
        f"$(touch {m}/dollar)",
        f"`touch {m}/backquote`",
        f"'; touch {m}/single; '",
        f'"; touch {m}/double; "',
        f"x\ntouch {m}/newline",
        f"&& touch {m}/and",
        f"| touch {m}/pipe",
        f"${{IFS}}touch${{IFS}}{m}/ifs",
        f"> {m}/redirect",
        "with  two spaces",
        "$HOME",
        "back\\slash",
        "*",
        "-n",
        "--",
        "",
        "ünïcödé ✓",
    ]


# -- rendering, no execution ----------------------------------------------------


def test_render_round_trips_through_a_posix_shell_parser(tmp_path: Path) -> None:
    values = hostile(tmp_path)
    cmd = Command(("printf", "%s", *values))
    assert shlex.split(cmd.render()) == ["printf", "%s", *values]


def test_render_env_cwd_and_sudo_forms() -> None:
    cmd = Command(("ls", "-l"), env={"A": "1 2", "B": "$(x)"}, cwd="/srv/my dir", sudo=True)
    line = cmd.render()
    assert line.startswith("cd -- '/srv/my dir' && ")
    words = shlex.split(line.split(" && ", 1)[1])
    assert words == ["sudo", "-n", "--", "env", "A=1 2", "B=$(x)", "ls", "-l"]
    assert "sudo" not in cmd.render(sudo=False)


def test_render_with_timeout_execs_coreutils_timeout() -> None:
    words = shlex.split(Command(("sleep", "5")).render(timeout=1.5))
    assert words[:2] == ["exec", "timeout"]
    assert words[-3:] == ["1.500", "sleep", "5"]


def test_cwd_starting_with_dash_is_not_an_option() -> None:
    assert Command(("pwd",), cwd="-rf").render().startswith("cd -- ./-rf && ")


def test_shell_passes_values_positionally() -> None:
    cmd = Command.shell('echo "$1"', "$(reboot)")
    assert cmd.argv == ("sh", "-c", 'echo "$1"', "sh", "$(reboot)")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"argv": ()},
        {"argv": ("echo", "a\0b")},
        {"argv": ("echo",), "env": {"BAD-NAME": "x"}},
        {"argv": ("echo",), "env": {"1X": "x"}},
        {"argv": ("A=B",), "env": {"X": "y"}},
    ],
)
def test_invalid_commands_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Command(**kwargs)  # type: ignore[arg-type]


def test_display_masks_secrets_everywhere() -> None:
    secret = "s3cr'et tok"
    cmd = Command(
        ("curl", "-H", f"Authorization: Bearer {secret}"),
        env={"HF_TOKEN": secret},
        cwd=f"/x/{secret}",
        secrets=frozenset({secret}),
    )
    shown = cmd.display()
    assert "s3cr" not in shown and "tok" not in shown
    assert shown.count("***") == 3
    assert secret in shlex.split(cmd.render().split(" && ", 1)[1])[-1]


def test_result_check_masks_secrets_in_stderr() -> None:
    result = Result(
        "cmd ***", 3, "", "error: bad token hunter2\n", 0.1, "h", frozenset({"hunter2"})
    )
    with pytest.raises(RemoteCommandError) as info:
        result.check()
    assert "hunter2" not in str(info.value)
    assert "exited 3" in str(info.value) and "bad token ***" in str(info.value)
    ok = Result("true", 0, "", "", 0.0)
    assert ok.check() is ok and ok.ok


# -- execution over both transports ---------------------------------------------


@pytest.fixture(params=["local", "ssh"])
def transport(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ExecTransport]:
    if request.param == "local":
        with LocalTransport() as local:
            yield local
        return
    server: Sshd = request.getfixturevalue("sshd")
    known = tmp_path_factory.mktemp("kh") / "known_hosts"
    known.write_text(server.known_hosts_line() + "\n")
    with SshTransport(
        "127.0.0.1",
        port=server.port,
        user="root",
        identity_file=server.client_key,
        known_hosts=known,
        load_ssh_config=False,
        connect_timeout=5,
    ) as ssh:
        yield ssh


def _marks(tmp_path: Path) -> Path:
    marks = tmp_path / "marks"
    marks.mkdir()
    return marks


def test_hostile_argv_elements_arrive_verbatim(transport: ExecTransport, tmp_path: Path) -> None:
    marks = _marks(tmp_path)
    values = hostile(marks)
    result = transport.run(Command(("printf", "%s\\0", *values))).check()
    assert result.stdout.split("\0")[:-1] == values
    assert list(marks.iterdir()) == []


def test_hostile_env_values_arrive_verbatim(transport: ExecTransport, tmp_path: Path) -> None:
    marks = _marks(tmp_path)
    values = hostile(marks)
    env = {f"V{i}": v for i, v in enumerate(values)}
    script = "printf '%s\\0' " + " ".join(f'"$V{i}"' for i in range(len(values)))
    result = transport.run(Command(("sh", "-c", script), env=env)).check()
    assert result.stdout.split("\0")[:-1] == values
    assert list(marks.iterdir()) == []


def test_hostile_cwd_is_entered_not_executed(transport: ExecTransport, tmp_path: Path) -> None:
    marks = _marks(tmp_path)
    for i, value in enumerate(v for v in hostile(marks) if v not in ("", "--", "-n")):
        where = tmp_path / "dirs" / str(i) / value.lstrip("/")
        where.mkdir(parents=True, exist_ok=True)
        result = transport.run(Command(("pwd",), cwd=str(where))).check()
        assert result.stdout[:-1] == str(where)
    assert list(marks.iterdir()) == []


def test_hostile_shell_args_are_positional(transport: ExecTransport, tmp_path: Path) -> None:
    marks = _marks(tmp_path)
    values = hostile(marks)
    result = transport.run(Command.shell('printf "%s\\0" "$@"', *values)).check()
    assert result.stdout.split("\0")[:-1] == values
    assert list(marks.iterdir()) == []


def test_stdin_bytes_reach_the_command(transport: ExecTransport, tmp_path: Path) -> None:
    payload = b"$(touch " + str(tmp_path / "x").encode() + b")\n\x00\xff binary"
    result = transport.run(Command(("od", "-An", "-tx1"), stdin=payload)).check()
    assert bytes.fromhex(result.stdout.replace("\n", " ")) == payload
    assert not (tmp_path / "x").exists()
