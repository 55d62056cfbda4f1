"""Results and the transport protocol every host connection speaks.

`ExecTransport` implements the whole `Transport` protocol on top of one
primitive, `_exec` (run a shell string, stream stdin in and stdout out); the
local and the SSH transport only provide that primitive. The commands they run
are data (`command.Command`), rendered there.
"""

from __future__ import annotations

import io
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import BinaryIO, Protocol, Self, runtime_checkable

from ddtree_deploy.errors import CommandTimeout, RemoteCommandError, SudoError, TransportError
from ddtree_deploy.transport.command import KILL_AFTER, Command, mask_secrets, wrap_raw
from ddtree_deploy.transport.live import Lines, Listener

CHUNK = 256 * 1024
OUTPUT_LINES = 400  # a failed command's stderr as an error carries it: its last lines ...
OUTPUT_CHARS = 32_000  # ... and characters
BACKSTOP = 3.0  # extra seconds the caller waits before giving up on the far side


@dataclass(frozen=True)
class Result:
    """What a finished command left behind. `command` is the display form."""

    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    host: str = ""
    secrets: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> Result:
        """Return self when the command succeeded, else raise RemoteCommandError."""
        if self.ok:
            return self
        tail = mask_secrets("\n".join(self.stderr.strip().splitlines()[-15:])[-2000:], self.secrets)
        where = f"{self.host}: " if self.host else ""
        message = f"{where}command exited {self.exit_code}: {self.command}"
        if tail:
            message += "\n" + "\n".join("  | " + line for line in tail.splitlines())
        raise RemoteCommandError(message, output=self.error_output())

    def error_output(self) -> str:
        """Its stderr for an error to carry (`DeployError.output`): secrets masked, the last
        OUTPUT_LINES lines and OUTPUT_CHARS characters, what was left out said."""
        lines = mask_secrets(self.stderr, self.secrets).strip().splitlines()
        kept = "\n".join(lines[-OUTPUT_LINES:])
        cut = max(len(lines) - OUTPUT_LINES, 0)
        if len(kept) > OUTPUT_CHARS:
            cut += kept[:-OUTPUT_CHARS].count("\n") + 1
            kept = kept[-OUTPUT_CHARS:].split("\n", 1)[-1]
        return (f"[... {cut} earlier lines left out ...]\n" if cut else "") + kept


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@runtime_checkable
class Transport(Protocol):
    """A narrow channel to one host: run commands, stream files and tar pipes."""

    host: str

    def run(self, cmd: Command | str, *, timeout: float | None = None) -> Result: ...

    def put_stream(self, src: BinaryIO, remote_path: str, *, mode: int | None = None) -> int: ...

    def get_stream(self, remote_path: str, dst: BinaryIO) -> int: ...

    def run_stream_in(
        self, cmd: Command | str, src: BinaryIO, *, timeout: float | None = None
    ) -> Result: ...

    def run_stream_out(
        self, cmd: Command | str, dst: BinaryIO, *, timeout: float | None = None
    ) -> Result: ...

    def close(self) -> None: ...

    def __enter__(self) -> Transport: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


KEEP_HEAD = 64 << 20  # a command's collected output: its first 64 MiB ...
KEEP_TAIL = 1 << 20  # ... and its last 1 MiB (a script's answer is its last line)


class Capture:
    """A command's collected output, bounded: the head and the tail are kept, what lies
    between is counted and dropped (a host process that writes gigabytes neither exhausts
    the workstation's memory nor stops being read, so it ends or meets its deadline).
    `tap` is handed every chunk as it comes (the live lines of apply)."""

    def __init__(self, head: int = KEEP_HEAD, tail: int = KEEP_TAIL,
                 tap: Callable[[bytes], None] | None = None) -> None:
        self._head, self._tail = bytearray(), bytearray()
        self._head_max, self._tail_max = head, tail
        self._tap = tap
        self.dropped = 0

    def append(self, data: bytes) -> None:
        if self._tap is not None:
            self._tap(data)
        room = self._head_max - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        self._tail += data
        over = len(self._tail) - self._tail_max
        if over > 0:
            del self._tail[:over]
            self.dropped += over

    def value(self) -> bytes:
        if not self.dropped:
            return bytes(self._head + self._tail)
        mark = f"\n[... {self.dropped} bytes of output dropped ...]\n".encode()
        return bytes(self._head) + mark + bytes(self._tail)


@dataclass
class RawOutcome:
    """What `_exec` reports: exit code (None if it never came), stdout and stderr."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    duration: float
    timed_out: bool = False


class _CountingReader(io.RawIOBase):
    """Wraps a source so the bytes actually read can be counted."""

    def __init__(self, src: BinaryIO) -> None:
        self._src = src
        self.count = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._src.read(size)
        self.count += len(data)
        return data


# Told of every command a transport ran: (its display form, exit code or None when it was
# killed at its deadline, seconds, its stdout and stderr with secrets masked); apply's run log
# and -v listen here.
Observer = Callable[[str, "int | None", float, str, str], None]
# What `_exec` hands each chunk of collected output to as it is read: ("out" | "err", bytes).
Tap = Callable[[str, bytes], None]


class ExecTransport(ABC):
    """Everything of `Transport` built on one primitive, `_exec`."""

    host: str
    observers: tuple[Observer, ...] = ()  # set per instance (apply_host), never shared
    listeners: tuple[Listener, ...] = ()  # told each output line as it comes (apply)
    redact: frozenset[str] = frozenset()  # values masked as *** beside each command's own

    @abstractmethod
    def _exec(
        self,
        script: str,
        *,
        stdin: BinaryIO | None,
        stdout: BinaryIO | None,
        deadline: float | None,
        live: Tap | None = None,
    ) -> RawOutcome:
        """Run `script` with the far side's POSIX shell.

        stdin: streamed in and then closed (None: empty input); stdout: where
        standard output goes (None: collect it into the outcome). `deadline` is
        the monotonic time after which the command is killed and the outcome
        is marked timed_out. `live` is handed each chunk of the output it collects
        as it is read (never the output streamed to `stdout`).
        """

    @abstractmethod
    def _is_root(self) -> bool:
        """Whether commands already run as root on the far side."""

    def _remote_uid(self, timeout: float) -> int:
        """The far side's user id, asked with `id -u`."""
        result = self.run("id -u", timeout=timeout)
        try:
            return int(result.stdout.strip())
        except ValueError as exc:
            raise TransportError(
                f"{self.host}: cannot tell the remote user id (id -u: {result.stderr.strip()})"
            ) from exc

    def tell_as(self, beside: ExecTransport, mark: str | None = None) -> None:
        """Tell `beside`'s observers and listeners of this transport's commands too, with its
        values masked; their display form starts with `(mark) ` when given (what a step runs
        on the workstation, or on the lane copy's source host)."""

        def marked(hear: Callable[..., None]) -> Callable[..., None]:
            if mark is None:
                return hear
            return lambda command, *rest: hear(f"({mark}) {command}", *rest)

        self.observers = tuple(marked(o) for o in beside.observers)
        self.listeners = tuple(marked(li) for li in beside.listeners)
        self.redact = beside.redact

    def close(self) -> None:  # pragma: no cover - overridden where there is state
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- running ------------------------------------------------------------

    def _go(
        self,
        cmd: Command | str,
        *,
        stdin: BinaryIO | None,
        stdout: BinaryIO | None,
        timeout: float | None,
    ) -> Result:
        if isinstance(cmd, Command):
            use_sudo = cmd.sudo and not self._is_root()
            script = cmd.render(sudo=use_sudo, timeout=timeout)
            shown, secrets = cmd.display(), cmd.secrets
            if stdin is None and cmd.stdin is not None:
                stdin = io.BytesIO(cmd.stdin)
        else:
            use_sudo = False
            script, shown, secrets = wrap_raw(cmd, timeout=timeout), cmd, frozenset()
        secrets = secrets | self.redact
        shown = mask_secrets(shown, self.redact)
        lines = Lines(shown, secrets, self.listeners) if self.listeners else None
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout + KILL_AFTER + BACKSTOP
        try:
            raw = self._exec(script, stdin=stdin, stdout=stdout, deadline=deadline,
                             live=lines.feed if lines is not None else None)
        finally:
            if lines is not None:
                lines.flush()
        duration = time.monotonic() - start
        stderr = decode(raw.stderr)
        timed_out = raw.timed_out or (
            # coreutils timeout exits 124; when KILL was needed it dies with its group
            # (128+9 locally, an exit-signal and no status over SSH, which the OpenSSH
            # client reports as 255).
            timeout is not None
            and raw.exit_code in (124, 137, 255, None, -1)
            and duration >= timeout * 0.9
        )
        if self.observers:
            said = (mask_secrets(decode(raw.stdout), secrets), mask_secrets(stderr, secrets))
            for observe in self.observers:
                observe(shown, None if timed_out else raw.exit_code, duration, *said)
        if timed_out:
            raise CommandTimeout(
                f"{self.host}: command did not finish within {timeout:g}s and was killed: {shown}"
            )
        code = raw.exit_code if raw.exit_code is not None else -1
        if use_sudo:
            _check_sudo(self.host, code, stderr)
        return Result(
            command=shown,
            exit_code=code,
            stdout=decode(raw.stdout),
            stderr=stderr,
            duration=duration,
            host=self.host,
            secrets=secrets,
        )

    def run(self, cmd: Command | str, *, timeout: float | None = None) -> Result:
        return self._go(cmd, stdin=None, stdout=None, timeout=timeout)

    def run_stream_in(
        self, cmd: Command | str, src: BinaryIO, *, timeout: float | None = None
    ) -> Result:
        """Run `cmd` with `src` streamed to its standard input (e.g. `tar -x`)."""
        return self._go(cmd, stdin=src, stdout=None, timeout=timeout)

    def run_stream_out(
        self, cmd: Command | str, dst: BinaryIO, *, timeout: float | None = None
    ) -> Result:
        """Run `cmd` with its standard output streamed into `dst` (e.g. `tar -c`)."""
        return self._go(cmd, stdin=None, stdout=dst, timeout=timeout)

    def run_piped(
        self, cmd: Command | str, src: BinaryIO, dst: BinaryIO, *, timeout: float | None = None
    ) -> Result:
        """Run `cmd` with `src` streamed in and its standard output streamed into `dst` as it
        comes (e.g. a long-running holder whose first line says it is ready)."""
        return self._go(cmd, stdin=src, stdout=dst, timeout=timeout)

    # -- files --------------------------------------------------------------

    def put_stream(
        self,
        src: BinaryIO,
        remote_path: str,
        *,
        mode: int | None = None,
        sudo: bool = False,
    ) -> int:
        """Stream `src` into `remote_path` via a temporary name and a rename."""
        tmp = f"{remote_path}.ddtree-tmp-{uuid.uuid4().hex[:12]}"
        script = (
            'if [ -n "$3" ]; then umask 077; fi; '
            'if ! cat > "$2"; then rm -f -- "$2"; exit 1; fi; '
            'if [ -n "$3" ] && ! chmod "$3" "$2"; then rm -f -- "$2"; exit 1; fi; '
            'mv -f -- "$2" "$1" || { rm -f -- "$2"; exit 1; }'
        )
        octal = "" if mode is None else format(mode, "o")
        counter = _CountingReader(src)
        cmd = Command.shell(script, _safe_path(remote_path), _safe_path(tmp), octal, sudo=sudo)
        result = self.run_stream_in(cmd, counter)  # type: ignore[arg-type]
        if not result.ok:
            raise RemoteCommandError(
                f"{self.host}: could not write {remote_path}: "
                f"{result.stderr.strip() or f'exit code {result.exit_code}'}"
            )
        return counter.count

    def get_stream(self, remote_path: str, dst: BinaryIO, *, sudo: bool = False) -> int:
        """Stream the far file `remote_path` into `dst`; returns the bytes written."""
        counter = _CountingWriter(dst)
        cmd = Command(("cat", "--", remote_path), sudo=sudo)
        result = self.run_stream_out(cmd, counter)  # type: ignore[arg-type]
        if not result.ok:
            raise RemoteCommandError(
                f"{self.host}: could not read {remote_path}: "
                f"{result.stderr.strip() or f'exit code {result.exit_code}'}"
            )
        return counter.count


class _CountingWriter(io.RawIOBase):
    def __init__(self, dst: BinaryIO) -> None:
        self._dst = dst
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._dst.write(data)
        self.count += len(data)
        return len(data)


def _safe_path(path: str) -> str:
    return "./" + path if path.startswith("-") else path


_SUDO_PASSWORD = ("a password is required", "a terminal is required")


def _check_sudo(host: str, code: int, stderr: str) -> None:
    """Turn sudo's own refusals into SudoError; the command's failures pass through."""
    if code == 0:
        return
    low = stderr.lower()
    if code == 1 and "sudo:" in low and any(t in low for t in _SUDO_PASSWORD):
        raise SudoError(
            f"{host}: sudo wants a password for this user (sudo -n refused)",
            hint="allow passwordless sudo for the deploy user (NOPASSWD in sudoers) "
            "or connect as root",
        )
    if code == 127 and "sudo" in low and ("not found" in low or "no such file" in low):
        raise SudoError(
            f"{host}: sudo is not installed and the user is not root",
            hint="install sudo on the host or connect as root",
        )
