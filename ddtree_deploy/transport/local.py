"""The transport for `localhost`: the same semantics as SSH, run with /bin/sh."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, BinaryIO

from ddtree_deploy.errors import TransportError
from ddtree_deploy.transport.base import CHUNK, Capture, ExecTransport, RawOutcome, Tap

_SHELL = "/bin/sh"


def _pump_in(src: BinaryIO, pipe: IO[bytes]) -> None:
    try:
        while chunk := src.read(CHUNK):
            pipe.write(chunk)
            pipe.flush()  # a reader may answer a line before the rest comes (a lock's request)
    except (BrokenPipeError, ValueError):
        pass  # the command stopped reading; its exit code tells the story
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


def _pump_out(pipe: IO[bytes], sink: BinaryIO | Capture) -> None:
    fd = pipe.fileno()
    while chunk := os.read(fd, CHUNK):
        if isinstance(sink, Capture):
            sink.append(chunk)
        else:
            sink.write(chunk)


def _shell_status(code: int) -> int:
    return 128 - code if code < 0 else code


def run_process(argv: list[str], *, stdin: BinaryIO | None, stdout: BinaryIO | None,
                deadline: float | None, own_group: bool, host: str,
                live: Tap | None = None) -> RawOutcome:
    """Run a program with its input streamed in and its output collected (or streamed to
    `stdout`), killed at `deadline` (with its whole process group when `own_group`); `live`
    is handed what is collected as it is read."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=own_group,
        )
    except OSError as exc:
        raise TransportError(f"{host}: cannot start {argv[0]}: {exc}") from exc
    assert proc.stdout is not None and proc.stderr is not None
    out_chunks, err_chunks = Capture(tap=_tap(live, "out")), Capture(tap=_tap(live, "err"))
    threads = [
        threading.Thread(
            target=_pump_out,
            args=(proc.stdout, stdout if stdout is not None else out_chunks),
            daemon=True,
        ),
        threading.Thread(target=_pump_out, args=(proc.stderr, err_chunks), daemon=True),
    ]
    if stdin is not None:
        assert proc.stdin is not None
        threads.append(threading.Thread(target=_pump_in, args=(stdin, proc.stdin), daemon=True))
    for thread in threads:
        thread.start()
    timed_out = False
    try:
        wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc, own_group)
    except BaseException:
        _kill(proc, own_group)
        raise
    for thread in threads:
        # A process that escaped the group may hold the pipes open: bounded join.
        thread.join(timeout=5.0)
    for pipe in (proc.stdout, proc.stderr, proc.stdin):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    return RawOutcome(
        exit_code=None if timed_out else proc.returncode,
        stdout=out_chunks.value(),
        stderr=err_chunks.value(),
        duration=time.monotonic() - start,
        timed_out=timed_out,
    )


def _tap(live: Tap | None, stream: str) -> Callable[[bytes], None] | None:
    """`live` for one stream (what a Capture is handed)."""
    if live is None:
        return None
    return lambda data: live(stream, data)


def _kill(proc: subprocess.Popen[bytes], group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)


class LocalTransport(ExecTransport):
    """Runs commands on this machine, each in its own session (killable as a group)."""

    def __init__(self, host: str = "localhost") -> None:
        self.host = host

    def _is_root(self) -> bool:
        return os.geteuid() == 0

    def close(self) -> None:
        return None

    def _exec(
        self,
        script: str,
        *,
        stdin: BinaryIO | None,
        stdout: BinaryIO | None,
        deadline: float | None,
        live: Tap | None = None,
    ) -> RawOutcome:
        outcome = run_process([_SHELL, "-c", script], stdin=stdin, stdout=stdout,
                              deadline=deadline, own_group=True, host=self.host, live=live)
        if outcome.exit_code is None:
            return outcome
        # killed by a signal: as a shell reports it (128 + the signal's number)
        return dataclasses.replace(outcome, exit_code=_shell_status(outcome.exit_code))
