"""run_json: every way a host-side script can fail to answer is one error, with a clear message.

The scripts run for real over LocalTransport with this machine's python; each failure (exit
code, no python, no output, a last line that is no JSON, JSON that is no object, the time
running out) must be a RemoteScriptError naming the host, what ran, the exit code and the tail
of stderr, and a CLI exit code (1, or 124 for the timeout as for any deadline).
"""

from __future__ import annotations

import sys

import pytest

from ddtree_deploy.errors import CommandTimeout, DeployError, ExitCode, RemoteCommandError
from ddtree_deploy.remote.runner import (
    RemoteScriptError,
    RemoteScriptTimeout,
    read_json,
    run_json,
    script_command,
)
from ddtree_deploy.transport import Command, LocalTransport
from ddtree_deploy.transport.base import Result

PY = sys.executable


def _run(script: str, *args: str, **kwargs: object) -> dict[str, object]:
    kwargs.setdefault("timeout", 30)
    with LocalTransport() as t:
        return run_json(t, script, args, python=PY, what="the test script",
                        **kwargs)  # type: ignore[arg-type]


def test_the_answer_is_the_last_line_as_an_object() -> None:
    script = "import json, sys; print('a warning first'); print(json.dumps({'args': sys.argv[1:]}))"
    assert _run(script, "x", "y z") == {"args": ["x", "y z"]}


def test_stdin_data_goes_to_the_script_given_on_the_command_line() -> None:
    script = "import json, sys; print(json.dumps({'got': sys.stdin.read()}))"
    assert _run(script, stdin=b"data") == {"got": "data"}


@pytest.mark.parametrize(
    ("script", "problem", "says"),
    [
        ("import sys; sys.stderr.write('l1\\nl2\\nboom\\n'); sys.exit(3)", "exit",
         r"^localhost: the test script failed \(exit 3\): l1; l2; boom$"),
        ("pass", "no-output", r"failed \(exit 0\): it printed nothing$"),
        ("print('hello [red]x[/red]')", "not-json",
         r"failed \(exit 0\): its last line is no JSON: 'hello \[red\]x\[/red\]'$"),
        ("print('[1, 2]')", "not-object",
         r"failed \(exit 0\): it answered JSON that is no object: '\[1, 2\]'$"),
        ("import sys; print('{\"ok\": 1}'); sys.stderr.write('late\\n'); sys.exit(1)", "exit",
         r"failed \(exit 1\): late$"),
        ("raise SystemExit('bad flag')", "exit", r"failed \(exit 1\): bad flag$"),
    ],
)
def test_each_failure_is_one_error_type(script: str, problem: str, says: str) -> None:
    with pytest.raises(RemoteScriptError, match=says) as info:
        _run(script)
    err = info.value
    assert err.problem == problem
    assert err.result is not None and err.result.host == "localhost"
    assert isinstance(err, RemoteCommandError) and isinstance(err, DeployError)
    assert err.exit_code == ExitCode.FAILED
    assert "import" not in err.message  # the script itself is never dumped


def test_a_missing_python_is_named() -> None:
    with pytest.raises(RemoteScriptError, match=r"failed \(exit 127\): no runnable python at "
                       r"/no/such/python") as info, LocalTransport() as t:
        run_json(t, "print(1)", python="/no/such/python", what="the test script",
                 timeout=30)
    assert info.value.problem == "no-python"


def test_the_timeout_is_the_same_error_and_a_deadline() -> None:
    with pytest.raises(RemoteScriptError, match=r"the test script failed: it did not finish "
                       r"within 0.5s and was killed") as info:
        _run("import time; time.sleep(30)", timeout=0.5)
    err = info.value
    assert isinstance(err, RemoteScriptTimeout) and isinstance(err, CommandTimeout)
    assert err.problem == "timeout" and err.result is None
    assert err.exit_code == ExitCode.DEADLINE


def test_other_exit_codes_answer_when_the_caller_says_so() -> None:
    script = "import json, sys; print(json.dumps({'error': 'refused'})); sys.exit(3)"
    assert _run(script, timeout=30, answers=(0, 3)) == {"error": "refused"}
    assert _run(script, timeout=30, answers=None) == {"error": "refused"}
    with pytest.raises(RemoteScriptError, match=r"failed \(exit 3\)"):
        _run(script, timeout=30)


def test_the_hint_travels_with_the_error() -> None:
    with pytest.raises(RemoteScriptError) as info:
        _run("pass", timeout=30, hint="the host needs python3")
    assert str(info.value).endswith("\n  hint: the host needs python3")


def test_a_ready_command_runs_as_given() -> None:
    cmd = Command((PY, "-c", "import json, os; print(json.dumps({'cwd': os.getcwd()}))"), cwd="/")
    with LocalTransport() as t:
        assert run_json(t, cmd, timeout=30, what="x") == {"cwd": "/"}


def test_script_command_sends_the_script_on_stdin_unless_stdin_carries_data() -> None:
    on_stdin = script_command("print(1)", ("a",), python="py", flags=("-I",))
    assert on_stdin.argv == ("py", "-I", "-", "a") and on_stdin.stdin == b"print(1)"
    inline = script_command(b"print(1)", ("a",), python="py", stdin=b"[]", sudo=True)
    assert inline.argv == ("py", "-c", "print(1)", "a") and inline.stdin == b"[]"
    assert inline.sudo


def test_read_json_on_a_streamed_result_masks_secrets() -> None:
    result = Result(command="x", exit_code=2, stdout="", stderr="token s3cret refused\n",
                    duration=0.1, host="h1", secrets=frozenset({"s3cret"}))
    with pytest.raises(RemoteScriptError, match=r"^h1: the receiver failed \(exit 2\): "
                       r"token \*\*\* refused$"):
        read_json(result, "the receiver")
