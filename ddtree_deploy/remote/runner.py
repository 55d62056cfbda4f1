"""Run a host-side script and read its answer: the one boundary where that can go wrong.

Every script of this package answers with ONE JSON object on the last line of its standard
output. `run_json` runs a script over a transport and `read_json` reads a finished command's
result (for the scripts that stream through run_stream_in/out); both map every way the answer
can be missing to one error, `RemoteScriptError` (exit 1), whose message names the host, what
ran, the exit code, what was wrong and the last lines of its standard error
(`HOST: WHAT failed (exit N): DETAIL; STDERR TAIL`):

- an exit code that is not one of the script's answers (0 unless the caller says otherwise);
- no python to run it (exit 126/127);
- no output, a last line that is no JSON, JSON that is not an object;
- the time running out (`RemoteScriptTimeout`, also a CommandTimeout: exit 124).

What the answer then says (its own "error" or "refused" keys) is the caller's to judge.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from ddtree_deploy.errors import CommandTimeout, ExitCode, RemoteCommandError
from ddtree_deploy.transport.base import Result, Transport
from ddtree_deploy.transport.command import Command

STDERR_LINES = 3  # the tail of stderr kept in a message (whole in .output: apply -vv)
STDERR_CHARS = 600
SHOWN_CHARS = 200  # of a last line that is not the answer


class RemoteScriptError(RemoteCommandError):
    """A host-side script gave no JSON object as its answer. `problem` says what was wrong
    ("exit", "no-python", "no-output", "not-json", "not-object", "timeout"); `result` is the
    finished command (None after a timeout)."""

    def __init__(self, message: str, *, problem: str, result: Result | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint,
                         output=result.error_output() if result is not None else "")
        self.problem = problem
        self.result = result


class RemoteScriptTimeout(RemoteScriptError, CommandTimeout):
    """The script did not finish in its time and was killed (exit 124, as any deadline)."""

    exit_code = ExitCode.DEADLINE


def script_command(script: str | bytes, args: Sequence[str] = (), *, python: str = "python3",
                   flags: Sequence[str] = (), stdin: bytes | None = None,
                   sudo: bool = False) -> Command:
    """`python FLAGS - ARGS` with the script on stdin; with `stdin` (the script's input data)
    `python FLAGS -c SCRIPT ARGS` instead."""
    if stdin is None:
        source = script.encode() if isinstance(script, str) else script
        return Command((python, *flags, "-", *args), stdin=source, sudo=sudo)
    text = script.decode() if isinstance(script, bytes) else script
    return Command((python, *flags, "-c", text, *args), stdin=stdin, sudo=sudo)


def run_json(t: Transport, script: str | bytes | Command, args: Sequence[str] = (), *,
             timeout: float, what: str, python: str = "python3", flags: Sequence[str] = (),
             stdin: bytes | None = None, sudo: bool = False,
             answers: Collection[int] | None = (0,), hint: str | None = None) -> dict[str, Any]:
    """Run `script` on t's host (a script's text, see script_command, or a ready Command) and
    return its JSON answer; RemoteScriptError for anything else.

    `answers`: the exit codes with which the script answers (None: any, the JSON decides).
    """
    if isinstance(script, Command):
        cmd = script
    else:
        cmd = script_command(script, args, python=python, flags=flags, stdin=stdin, sudo=sudo)
    try:
        result = t.run(cmd, timeout=timeout)
    except CommandTimeout as exc:
        raise RemoteScriptTimeout(f"{t.host}: {what} failed: it did not finish within "
                                  f"{timeout:g}s and was killed", problem="timeout",
                                  hint=hint) from exc
    return read_json(result, what, answers=answers, hint=hint, program=cmd.argv[0])


def read_json(result: Result, what: str, *, answers: Collection[int] | None = (0,),
              hint: str | None = None, program: str = "python") -> dict[str, Any]:
    """The JSON object on the last line of a finished script's stdout; RemoteScriptError
    (exit code, no python, no output, not JSON, not an object) otherwise. `program`: what
    ran the script (named when it could not start)."""
    code = result.exit_code
    lines = result.stdout.strip().splitlines()
    problem, detail = "", ""
    data: object = None
    if code in (126, 127) and not lines:
        problem, detail = "no-python", f"no runnable python at {program}"
    elif answers is not None and code not in answers:
        problem = "exit"
    elif not lines:
        problem, detail = "no-output", "it printed nothing"
    else:
        try:
            data = json.loads(lines[-1])
        except ValueError:
            problem, detail = "not-json", f"its last line is no JSON: {_shown(lines[-1])}"
        else:
            if not isinstance(data, dict):
                problem = "not-object"
                detail = f"it answered JSON that is no object: {_shown(lines[-1])}"
    if problem:
        raise failure(result, what, detail, problem=problem, hint=hint)
    assert isinstance(data, dict)
    return data


def failure(result: Result, what: str, detail: str = "", *, problem: str = "exit",
            hint: str | None = None) -> RemoteScriptError:
    """The error for a script that gave no answer: `{host}: {what} failed (exit N)[: detail]`
    and the last lines of its stderr. Also for the scripts that stream (no JSON) and failed."""
    where = f"{result.host}: " if result.host else ""
    message = f"{where}{what} failed (exit {result.exit_code})"
    tail = _tail(result)
    if detail:
        message += f": {detail}" + (f"; {tail}" if tail else "")
    elif tail:
        message += f": {tail}"
    return RemoteScriptError(message, problem=problem, result=result, hint=hint)


def _shown(text: str) -> str:
    """Host text in a message: quoted (control characters escaped), bounded."""
    return repr(text[:SHOWN_CHARS]) + ("..." if len(text) > SHOWN_CHARS else "")


def _tail(result: Result) -> str:
    """The last lines of stderr (secrets masked), joined by '; '."""
    tail = "; ".join(result.stderr.strip().splitlines()[-STDERR_LINES:])[-STDERR_CHARS:]
    for secret in result.secrets:
        if secret:
            tail = tail.replace(secret, "***")
    return tail
