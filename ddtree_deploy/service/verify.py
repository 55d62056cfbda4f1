"""Check a rendered unit with `systemd-analyze verify` on the host that will run it.

The unit goes into a fresh temporary folder on the host under its real name and
is verified there, so the analyzer sees the host's own ExecStart binary (a venv
python that is missing fails here, before anything is installed). The analyzer
exits 0 on many warnings ("Unknown key ..., ignoring"), so any output at all
counts as a failure, as does a non-zero exit.
"""

from __future__ import annotations

import io
import re

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.transport.base import Result, Transport
from ddtree_deploy.transport.command import Command

VERIFY_TIMEOUT = 60.0
_SMALL_TIMEOUT = 20.0
_UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.-]{0,200}\.(service|socket|timer|target)\Z")
_FLAGS = ("--man=no", "--recursive-errors=no")
_OLD_ANALYZER = "recursive-errors"  # systemd < 250 does not know the flag


class UnitVerifyError(DeployError):
    """systemd-analyze verify refused a unit (or printed anything about it)."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, *, output: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.output = output


def _output(result: Result) -> str:
    return "\n".join(t for t in (result.stdout.strip(), result.stderr.strip()) if t)


def _analyze(transport: Transport, path: str, timeout: float) -> Result:
    env = {"SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""}
    cmd = Command(("systemd-analyze", "verify", *_FLAGS, path), env=env, sudo=True)
    result = transport.run(cmd, timeout=timeout)
    if (
        result.exit_code != 0
        and _OLD_ANALYZER in _output(result)
        and "unrecognized" in (_output(result).lower())
    ):
        cmd = Command(("systemd-analyze", "verify", "--man=no", path), env=env, sudo=True)
        result = transport.run(cmd, timeout=timeout)
    return result


def verify_unit(
    transport: Transport,
    unit_text: str,
    unit_name: str,
    *,
    timeout: float = VERIFY_TIMEOUT,
) -> None:
    """Raise UnitVerifyError unless `systemd-analyze verify` passes `unit_text` silently.

    Runs as root where the transport can (sudo -n), so an ExecStart under /root
    is checked as systemd would see it.
    """
    host = transport.host
    if not _UNIT_NAME.match(unit_name):
        raise UnitVerifyError(f"{unit_name!r} is not a unit file name (e.g. sglang-ddtree.service)")
    made = transport.run(
        Command.of("mktemp", "-d", "-t", "ddtree-verify.XXXXXXXX"), timeout=_SMALL_TIMEOUT
    )
    folder = made.stdout.strip()
    if not made.ok or not folder.startswith("/"):
        raise UnitVerifyError(
            f"{host}: could not make a temporary folder to verify {unit_name}",
            output=_output(made),
        )
    try:
        path = f"{folder}/{unit_name}"
        transport.put_stream(io.BytesIO(unit_text.encode("utf-8")), path, mode=0o644)
        result = _analyze(transport, path, timeout)
    finally:
        transport.run(Command.of("rm", "-rf", "--", folder), timeout=_SMALL_TIMEOUT)
    output = _output(result)
    if result.exit_code == 127 and "systemd-analyze" in output:
        raise UnitVerifyError(
            f"{host}: systemd-analyze is not installed; cannot verify {unit_name}",
            output=output,
            hint="install systemd on the host (units are only installed after a clean verify)",
        )
    if result.exit_code != 0 or output:
        shown = output.replace(folder + "/", "") if output else f"exit code {result.exit_code}"
        lines = "\n".join("  | " + line for line in shown.splitlines())
        raise UnitVerifyError(
            f"{host}: systemd-analyze verify rejected {unit_name}:\n{lines}",
            output=output,
            hint="the unit was not installed; fix the value it names and render again",
        )
