"""What apply shows while it runs (issue 31: minutes of silence during the lane copy and the
installs): each step as it begins and ends with its seconds; on a terminal a live status line
per host (step, seconds so far, the last line its command printed) and the lane copy's bars;
off a terminal plain lines, no control codes; -v the commands, -vv their output as it comes;
the summary's per-step seconds; secrets masked in all of it."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from ddtree_deploy.cli.applyview import LINE_SHOWN, ApplyView, failure_output, seconds, summary
from ddtree_deploy.converge.runner import HostRun
from ddtree_deploy.converge.steps import Step
from ddtree_deploy.transport.live import Lines

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # ESC, CR, ...: none off a terminal

STEP = Step("package.install", "ct200", "sglang-ddtree", "sglang==0.5.9", "")
LANE = Step("lane.overlay", "ct200", "sglang-ddtree", "CUDA lane cu130", "")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=120, color_system=None
                   if not terminal else "standard"), buf


def test_off_a_terminal_each_step_is_a_plain_line_with_its_seconds() -> None:
    con, buf = _console(False)
    with ApplyView(con, verbose=0, terminal=False) as view:
        assert view.progress is None  # no bars into a log file
        view.began("ct200", STEP, "package.install: sglang==0.5.9 — uv pip install")
        view.ended("ct200", STEP, 12.34, ok=True)
        view.began("ct200", LANE, "lane.overlay: CUDA lane cu130")
        for phase in ("backing-up", "backing-up", "checking", "checking"):  # polled each second
            view.note("ct200", f"on the host: {phase}")
        view.ended("ct200", LANE, 185.0, ok=False)
    assert buf.getvalue().splitlines() == [
        "ct200: package.install: sglang==0.5.9 — uv pip install",
        "ct200: package.install sglang==0.5.9 done in 12.3s",
        "ct200: lane.overlay: CUDA lane cu130",
        "ct200: on the host: backing-up",
        "ct200: on the host: checking",
        "ct200: lane.overlay CUDA lane cu130 failed in 3m05s",
    ]
    assert not CONTROL.search(buf.getvalue())


def test_on_a_terminal_a_status_line_shows_the_step_its_seconds_and_last_output() -> None:
    con, _ = _console(True)
    clock = Clock()
    view = ApplyView(con, verbose=0, terminal=True, clock=clock)
    (heard,) = view.listeners("ct200")  # the status line keeps the last line printed
    view.began("ct200", STEP, "package.install: sglang==0.5.9")
    heard("uv pip install ...", "err", "Prepared 3 packages in 2.10s")
    clock.now += 42
    shot, out = _console(False)
    shot.print(view)
    assert out.getvalue() == ("ct200: package.install sglang==0.5.9 (42s)  "
                              "Prepared 3 packages in 2.10s\n")
    view.ended("ct200", STEP, 42.0, ok=True)
    shot.print(view)
    assert out.getvalue().count("\n") == 1  # the step ended: its status line is gone


def test_on_a_terminal_the_lane_copy_gets_bars_drawn_in_the_live_part() -> None:
    con, _ = _console(True)
    shot, out = _console(False)
    with ApplyView(con, verbose=0, terminal=True) as view:
        bars = view.progress_for("ct200")
        assert bars is not None
        view.began("ct200", LANE, "lane.overlay: CUDA lane cu130")
        fetch = bars.begin("ct129", "fetch", 1000)  # the source's bar, for ct200's step
        push = bars.begin("ct200", "push (streamed)", 1000)
        for task in (fetch, push):
            bars.advance(task, 500)
        view.note("ct200", "on the host: checking")
        shot.print(view.live_part())
        drawn = out.getvalue()
        view.ended("ct200", LANE, 1.0, ok=True)  # the host's bars go with its step
        shot.print(view.live_part())
    status, fetched, pushed = drawn.splitlines()
    assert status == "ct200: lane.overlay CUDA lane cu130 (0s)  on the host: checking"
    assert fetched.startswith("ct129 fetch ") and "0.5/1.0 kB" in fetched
    assert pushed.startswith("ct200 push (streamed) ") and "0.5/1.0 kB" in pushed
    assert out.getvalue()[len(drawn):].strip() == ""


def test_v_shows_each_command_and_vv_its_output_line_by_line() -> None:
    con, buf = _console(False)
    view = ApplyView(con, verbose=2, terminal=False)
    (heard,) = view.listeners("ct200")
    done = view.observer("ct200")
    done("true", 0, 0.01, "", "")  # printed nothing: one line, once it ends
    done("sleep 9", None, 9.0, "", "")
    heard("uv pip install x", "err", "Resolved 3 packages in 10ms")  # as it comes
    heard("uv pip install x", "err", "Installed 3 packages in 40ms")
    done("uv pip install x", 0, 1.25, "ignored", "ignored")
    heard("python3 - ", "out", "x" * (LINE_SHOWN + 10))
    done("python3 - ", 1, 0.5, "", "")
    assert buf.getvalue().splitlines() == [
        "ct200: $ true (exit 0, 0.0s)",
        "ct200: $ sleep 9 (killed at its deadline, 9.0s)",
        "ct200: $ uv pip install x",
        "ct200:   err| Resolved 3 packages in 10ms",
        "ct200:   err| Installed 3 packages in 40ms",
        "ct200:   (exit 0, 1.2s)",
        "ct200: $ python3 - ",
        f"ct200:   out| {'x' * LINE_SHOWN} [... 10 more characters]",
        "ct200:   (exit 1, 0.5s)",
    ]
    quiet, qbuf = _console(False)
    (heard,) = ApplyView(quiet, verbose=1, terminal=True).listeners("ct200")
    heard("c", "err", "not shown at -v")  # on a terminal: for the status line only
    assert qbuf.getvalue() == ""


def test_host_text_is_never_markup_nor_control_codes() -> None:
    con, buf = _console(False)
    view = ApplyView(con, verbose=2, terminal=False)
    (heard,) = view.listeners("ct200")
    heard("c [/x]", "err", "[bold]x[/bold] \x1b[31mred")
    assert buf.getvalue() == "ct200: $ c [/x]\nct200:   err| [bold]x[/bold] \\x1b[31mred\n"


def test_the_summary_gives_each_steps_seconds_and_the_total() -> None:
    run = HostRun("ct200", timings=[("venv.create", "/root/venv", 4.0),
                                    ("lane.overlay", "CUDA lane cu130", 190.2),
                                    ("service.probe", "sglang-ddtree", 31.5)], total_s=230.0)
    assert summary(run) == [
        "      4.0s  venv.create    /root/venv",
        "     3m10s  lane.overlay   CUDA lane cu130",
        "     31.5s  service.probe  sglang-ddtree",
        "     3m50s  in all",
    ]
    assert summary(HostRun("ct200")) == []
    assert [seconds(s) for s in (0.04, 59.94, 60.0, 3725.0)] == ["0.0s", "59.9s", "1m00s",
                                                                "1h02m05s"]


def test_lines_are_cut_where_they_end_and_secrets_masked_across_chunks() -> None:
    heard: list[tuple[str, str, str]] = []
    lines = Lines("cmd", {"hunter2"}, (lambda c, s, ln: heard.append((c, s, ln)),))
    for chunk in (b"Downloading x (1.0 MB)\r 50%", b"\r100%\nkey hun", b"ter2 ok\n", b"tail"):
        lines.feed("err", chunk)
    lines.feed("out", b"answer\n")
    lines.flush()
    assert heard == [("cmd", "err", "Downloading x (1.0 MB)"), ("cmd", "err", " 50%"),
                     ("cmd", "err", "100%"), ("cmd", "err", "key *** ok"),
                     ("cmd", "out", "answer"), ("cmd", "err", "tail")]


def test_a_line_that_never_ends_is_told_in_pieces_without_cutting_a_secret() -> None:
    from ddtree_deploy.transport.live import LINE_MAX

    heard: list[str] = []
    lines = Lines("cmd", {"s3cr3t"}, (lambda c, s, ln: heard.append(ln),))
    lines.feed("err", b"a" * (LINE_MAX - 3) + b"s3cr3t" + b"b" * LINE_MAX * 2)
    lines.flush()
    assert "".join(heard) == "a" * (LINE_MAX - 3) + "***" + "b" * LINE_MAX * 2
    assert len(heard) >= 3 and all(len(h) <= LINE_MAX + 10 for h in heard)


@pytest.mark.parametrize("terminal", [True, False])
def test_nothing_of_the_view_needs_rich_markup(terminal: bool) -> None:
    con, buf = _console(terminal)
    with ApplyView(con, verbose=1, terminal=terminal) as view:
        view.began("h[/x]", STEP, "[/red] text")
        view.ended("h[/x]", STEP, 1.0, ok=True)
    assert "h[/x]: [/red] text" in buf.getvalue()


@pytest.mark.integration  # commands run through LocalTransport
def test_the_transport_tells_each_line_while_the_command_still_runs() -> None:
    """The command prints a line, then waits for its input: it ends only because the listener,
    told of that line while it runs, answers (a listener told at the end would never be; the
    command's own timeout would fail the test, not hang it)."""
    import os

    from ddtree_deploy.transport import Command
    from ddtree_deploy.transport.local import LocalTransport

    read_fd, write_fd = os.pipe()
    heard: list[tuple[str, str, str]] = []

    def listen(command: str, stream: str, line: str) -> None:
        heard.append((command, stream, line))
        if line == "waiting":
            os.write(write_fd, b"go\n")
            os.close(write_fd)

    t = LocalTransport("ct200")
    t.listeners = (listen,)
    with os.fdopen(read_fd, "rb") as stdin:
        result = t.run_stream_in(Command.of("sh", "-c", 'echo waiting >&2; read x; echo "got $x"'),
                                 stdin, timeout=60)
    assert result.ok and result.stdout == "got go\n"  # collected as ever
    assert [(s, ln) for _c, s, ln in heard] == [("err", "waiting"), ("out", "got go")]


@pytest.mark.integration
def test_secrets_are_masked_in_what_listeners_observers_and_errors_get() -> None:
    """The command's own secrets and the values apply masks on every command of the host
    (the deployments' API key and HF token: `redact`)."""
    from ddtree_deploy.errors import RemoteCommandError
    from ddtree_deploy.transport import Command
    from ddtree_deploy.transport.local import LocalTransport

    heard: list[str] = []
    seen: list[tuple[str, str, str]] = []
    t = LocalTransport("ct200")
    t.listeners = (lambda c, s, ln: heard.append(f"{c} {s}| {ln}"),)
    t.observers = (lambda c, code, took, out, err: seen.append((c, out, err)),)
    t.redact = frozenset({"hf_TOKENVALUE", "sk-APIKEY"})
    result = t.run(Command.of("sh", "-c", 'echo "$0 hf_TOKENVALUE"; echo "sk-APIKEY" >&2; exit 2',
                              "pw-own", secrets=frozenset({"pw-own"})))
    everything = " ".join(heard) + repr(seen) + result.command
    for secret in ("hf_TOKENVALUE", "sk-APIKEY", "pw-own"):
        assert secret not in everything
    assert "*** ***" in " ".join(heard) and "err| ***" in " ".join(heard)
    with pytest.raises(RemoteCommandError) as failed:
        result.check()
    assert "sk-APIKEY" not in str(failed.value) and "***" in str(failed.value)


@pytest.mark.integration
def test_a_streamed_stdout_is_data_never_told_as_lines() -> None:
    from ddtree_deploy.transport import Command
    from ddtree_deploy.transport.local import LocalTransport

    heard: list[str] = []
    t = LocalTransport()
    t.listeners = (lambda c, s, ln: heard.append(s + ln),)
    sink = io.BytesIO()
    t.run_stream_out(Command.of("sh", "-c", "echo tar-bytes; echo note >&2"), sink)
    assert sink.getvalue() == b"tar-bytes\n" and heard == ["errnote"]


# -- the failed command's stderr, whole (apply -vv, --debug) ------------------------------


def _failed(stderr: str, secrets: frozenset[str] = frozenset()) -> object:
    from ddtree_deploy.transport.base import Result

    return Result("venv_clone.py", 1, "", stderr, 0.5, host="ct200", secrets=secrets)


def test_a_script_failure_says_three_lines_and_carries_its_whole_stderr() -> None:
    from ddtree_deploy.errors import DeployError, output_of
    from ddtree_deploy.remote.runner import failure

    stderr = "\n".join(f"Traceback line {i}" for i in range(40)) + "\nOSError: disk full key=k3y"
    result = _failed(stderr, frozenset({"k3y"}))
    error = failure(result, "venv clone")  # type: ignore[arg-type]
    assert "Traceback line 0" not in error.message  # the message keeps the last lines
    with pytest.raises(DeployError) as caught:
        try:
            raise error
        except DeployError as exc:  # as the runner wraps a step's failure
            raise DeployError(f"ct200: step 'venv.create' failed: {exc.message}") from exc
    wrapped = caught.value
    whole = output_of(wrapped)
    assert whole.splitlines()[0] == "Traceback line 0" and len(whole.splitlines()) == 41
    assert whole.endswith("OSError: disk full key=***")
    assert failure_output("ct200", wrapped)[:2] == ["ct200: the failed command's stderr:",
                                                    "ct200:   err| Traceback line 0"]
    assert failure_output("ct200", DeployError("no command behind it")) == []


def test_a_failed_commands_stderr_is_bounded_and_says_what_it_left_out() -> None:
    from ddtree_deploy.errors import RemoteCommandError
    from ddtree_deploy.transport.base import OUTPUT_CHARS, OUTPUT_LINES

    many = "\n".join(f"line {i}" for i in range(OUTPUT_LINES + 50))
    with pytest.raises(RemoteCommandError) as e:
        _failed(many).check()  # type: ignore[attr-defined]
    lines = e.value.output.splitlines()
    assert lines[0] == "[... 50 earlier lines left out ...]" and lines[1] == "line 50"
    assert len(lines) == OUTPUT_LINES + 1 and lines[-1] == f"line {OUTPUT_LINES + 49}"
    wide = "\n".join("y" * 1000 for _ in range(100))
    with pytest.raises(RemoteCommandError) as e:
        _failed(wide).check()  # type: ignore[attr-defined]
    kept = e.value.output.split("\n", 1)[1]
    assert len(kept) <= OUTPUT_CHARS and set(kept.splitlines()) == {"y" * 1000}
    left = 100 - len(kept.splitlines())
    assert e.value.output.startswith(f"[... {left} earlier lines left out ...]\n")


def test_debug_adds_the_failed_commands_whole_stderr(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan whose facts script failed: the message keeps three lines, --debug all of it
    (host text escaped)."""
    from ddtree_deploy.cli import app as cli
    from ddtree_deploy.converge import runner
    from ddtree_deploy.remote.runner import failure
    from ddtree_deploy.resources import embedded_hosts_file

    stderr = "\n".join(f"trace {i}" for i in range(10)) + "\n\x1b[31mboom"

    def fails(*_a: object, **_k: object) -> None:
        raise failure(_failed(stderr), "facts probe")  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "make_plan", fails)
    hosts = str(embedded_hosts_file())
    for debug in ((), ("--debug",)):
        with pytest.raises(SystemExit):
            cli.main(["--hosts", hosts, "plan", "ct200", *debug])
        err = capsys.readouterr().err
        assert "trace 9" in err and ("trace 0" in err) == bool(debug)
        assert "\x1b" not in err


@pytest.mark.integration  # commands run through LocalTransport
def test_the_lane_copys_own_connections_are_heard_as_apply_hears_its_own(tmp_path: Path
                                                                         ) -> None:
    """The overlay opens connections of its own (the source host's, the target's bulk
    streams): apply's run log, -v and -vv hear their commands too, the source's marked with
    its name, with the same values masked."""
    from ddtree_deploy.config.hosts import load_config
    from ddtree_deploy.overlay.run import _bulk
    from ddtree_deploy.transport import Command
    from ddtree_deploy.transport.local import LocalTransport

    (tmp_path / "hosts.yaml").write_text(
        "version: 1\nhosts:\n  ct200:\n    transport: local\n  ct129:\n    transport: local\n")
    config = load_config(tmp_path / "hosts.yaml")
    seen: list[str] = []
    heard: list[str] = []
    apply_t = LocalTransport("ct200")
    apply_t.observers = (lambda c, code, took, out, err: seen.append(c),)
    apply_t.listeners = (lambda c, s, ln: heard.append(f"{c} {s}| {ln}"),)
    apply_t.redact = frozenset({"hf_x1"})
    for host in ("ct200", "ct129"):
        with _bulk(config, host, apply_t) as t:
            t.run(Command.of("echo", "hf_x1", host))
    assert seen == ["echo *** ct200", "(ct129) echo *** ct129"]
    assert heard == ["echo *** ct200 out| *** ct200",
                     "(ct129) echo *** ct129 out| *** ct129"]
    with _bulk(config, "ct129") as alone:  # overlay's own command: nobody listens
        assert alone.observers == () and alone.listeners == ()


def test_off_a_terminal_a_long_step_is_said_again_every_half_minute() -> None:
    """A log file gets no status line: a step that runs on is said again, with its seconds
    and the last line its command printed (never the output itself at default verbosity)."""
    from ddtree_deploy.cli.applyview import HEARTBEAT_S

    con, buf = _console(False)
    clock = Clock()
    view = ApplyView(con, verbose=0, terminal=False, clock=clock)
    (heard,) = view.listeners("ct200")
    view.began("ct200", STEP, "package.install: sglang==0.5.9")
    heard("pip download", "out", "Downloading sglang-0.5.9-py3-none-any.whl (3.1 MB)")
    view.tick()  # not yet
    clock.now += HEARTBEAT_S
    view.tick()
    view.tick()  # said once per period
    clock.now += HEARTBEAT_S * 2
    heard("uv pip install", "err", "Installed 1 package in 9ms")
    view.tick()
    view.ended("ct200", STEP, HEARTBEAT_S * 3, ok=True)
    clock.now += HEARTBEAT_S
    view.tick()  # the step is over: nothing more
    assert buf.getvalue().splitlines() == [
        "ct200: package.install: sglang==0.5.9",
        "ct200: package.install sglang==0.5.9 running for 30.0s: "
        "Downloading sglang-0.5.9-py3-none-any.whl (3.1 MB)",
        "ct200: package.install sglang==0.5.9 running for 1m30s: Installed 1 package in 9ms",
        "ct200: package.install sglang==0.5.9 done in 1m30s",
    ]


@pytest.mark.integration  # apply through the CLI, to a closed port on loopback
@pytest.mark.parametrize("as_json", [False, True])
def test_a_failed_hosts_message_never_shows_a_deployment_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool) -> None:
    """A message may carry host text; the deployment's API key is *** in it. Here the key
    is (as a made-up case) the very address the unreachable host's error names."""
    import json

    from typer.testing import CliRunner

    from ddtree_deploy.cli.app import build_app
    from ddtree_deploy.resources import embedded_hosts_file

    (tmp_path / "key").write_text("127.0.0.1\n")
    text = embedded_hosts_file().read_text()
    text = text.replace("address: 10.77.200.2\n    port: 22\n",
                        "address: 127.0.0.1\n    port: 1\n    connect_timeout: 5\n")
    text = text.replace("    payload: true ", f"    bind: 127.0.0.1\n    api_key_file: "
                                             f"{tmp_path / 'key'}\n    payload: true ")
    (tmp_path / "hosts.yaml").write_text(text)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    args = ["--hosts", str(tmp_path / "hosts.yaml"), "apply", "ct200", "--yes",
            *(("--json",) if as_json else ())]
    result = CliRunner().invoke(build_app(args), args)
    assert result.exit_code == 1, result.output
    said = result.stdout
    assert "127.0.0.1" not in said and "(***:1) unreachable" in said, said
    if as_json:
        (failed,) = json.loads(said)["results"]
        assert "(***:1) unreachable" in failed["error"]["message"]
    log = next((tmp_path / "state").rglob("*.jsonl")).read_text()
    assert "127.0.0.1" not in log and "(***:1) unreachable" in log
