"""A per-host apply lock held through its own command on the host, on a connection of its own
(so it never competes with the apply's commands for the server's sessions).

`flock -n` on the host holds the lock for as long as the session's command runs;
the command waits on its stdin, so when the CLI ends — normally, killed, or with
the connection cut — the session closes and the lock is released with it. The lock
file names the holder (workstation, user, pid) and since when, for the refusal. The
command's first line (LOCKED or BUSY) says at once which it is: no polling.
"""

from __future__ import annotations

import getpass
import os
import socket
import threading
import time
from typing import Any, BinaryIO, cast

from ddtree_deploy.config.hosts import HostSpec
from ddtree_deploy.converge.hoststate import STATE_DIR
from ddtree_deploy.errors import DeployError, RefusedError
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport

LOCK_FILE = f"{STATE_DIR}/apply.lock"
HOLD = r"""
mkdir -p "$(dirname "$1")"
exec 9>>"$1"
if ! flock -n 9; then echo "BUSY"; cat "$1"; exit 75; fi
printf '%s\n' "$2" > "$1"
echo "LOCKED"
cat > /dev/null
"""


class _Stdin:
    """A stdin for the holding command that blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def read(self, size: int = -1) -> bytes:
        self.release.wait()
        return b""


class _Watch:
    """The holding command's stdout: signals as soon as it says LOCKED (or BUSY, or ends)."""

    def __init__(self) -> None:
        self.text = bytearray()
        self.changed = threading.Event()

    def write(self, data: bytes) -> int:
        self.text += data
        if b"LOCKED\n" in self.text or b"BUSY" in self.text:
            self.changed.set()
        return len(data)

    def flush(self) -> None:
        return None

    @property
    def locked(self) -> bool:
        return self.text.startswith(b"LOCKED\n")


class HostLock:
    """Held by a command on `transport` while the context lasts; released on exit or when
    that connection drops (check() says so before each step)."""

    def __init__(self, transport: ExecTransport, host: HostSpec) -> None:
        self.transport, self.host = transport, host
        self.holder = (f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        self._stdin = _Stdin()
        self._watch = _Watch()
        self._thread: threading.Thread | None = None
        self._result: dict[str, Any] = {}

    def __enter__(self) -> HostLock:
        cmd = Command.shell(HOLD, LOCK_FILE, self.holder, sudo=True)
        watch = self._watch

        def hold() -> None:
            try:
                self._result["r"] = self.transport.run_piped(
                    cmd, cast(BinaryIO, self._stdin), cast(BinaryIO, watch), timeout=None)
            except Exception as exc:  # reported by __enter__, never lost
                self._result["error"] = exc
            finally:
                watch.changed.set()

        self._thread = threading.Thread(target=hold, daemon=True)
        self._thread.start()
        watch.changed.wait(timeout=max(15.0, self.host.connect_timeout + 5))
        if watch.locked and not self._result:
            return self
        self._stdin.release.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if "error" in self._result:
            raise self._result["error"]
        text = watch.text.decode(errors="replace").replace("BUSY", "").strip()
        raise RefusedError(f"another apply holds {self.host.name}: {text or 'unknown holder'}",
                           hint="wait for it to finish")

    def check(self) -> None:
        """Raise unless the holding command still runs (its connection may have dropped)."""
        if self._thread is None or not self._thread.is_alive() or self._result:
            why = self._result.get("error") or "the holding command ended"
            raise DeployError(f"{self.host.name}: lost the apply lock ({why}); run apply again")

    def __exit__(self, *exc: object) -> None:
        self._stdin.release.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
