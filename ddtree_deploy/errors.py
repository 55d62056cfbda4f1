"""One exception root for the tool, and the exit codes every command shares.

Library errors (paramiko, socket, OSError, YAML, pydantic) are mapped to these
at the boundary where they happen; the CLI turns a DeployError into its message
and exit code, never a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # the operation failed; for probe/doctor: the target is unhealthy
    USAGE = 2  # usage or configuration error
    PARTIAL = 3  # some hosts failed or were unreachable while others succeeded
    CHANGES_PENDING = 4  # plan: changes pending
    DEADLINE = 124  # a deadline passed


class DeployError(Exception):
    """Root of every error the tool raises on purpose. `output`: what the command that failed
    printed on stderr, whole but bounded (its message keeps a few lines of it), for
    `apply -vv` and `--debug` (see output_of)."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None, output: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.output = output

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


def output_of(exc: BaseException) -> str:
    """The `output` of the error or of the first error it was raised from that has one."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        if isinstance(at, DeployError) and at.output:
            return at.output
        at = at.__cause__ or at.__context__
    return ""


class ConfigError(DeployError):
    """A configuration file (hosts.yaml, an overlay) is wrong: file, line, field."""

    exit_code = ExitCode.USAGE


class UsageError(DeployError):
    exit_code = ExitCode.USAGE


class TransportError(DeployError):
    """Talking to a host failed (connect, auth, host key, I/O)."""


class UnreachableError(TransportError):
    """The host could not be reached within the connect timeout."""


class HostKeyError(TransportError):
    """The host's key is unknown or changed; it is never accepted silently."""


class AuthError(TransportError):
    pass


class CommandTimeout(TransportError):
    exit_code = ExitCode.DEADLINE


class SudoError(TransportError):
    """sudo -n wanted a password (or is missing) on a host with a non-root user."""


class RemoteCommandError(DeployError):
    """A remote command exited non-zero where success was required."""


class RefusedError(DeployError):
    """The tool refuses an action that would harm something it does not own (a busy GPU,
    a taken port, a unit it did not create)."""
