"""A per-host apply lock held through its own SSH session.

`flock -n` on the host holds the lock for as long as the session's command runs;
the command waits on its stdin, so when the CLI ends — normally, killed, or with
the connection cut — the session closes and the lock is released with it. The lock
file names the holder (workstation, user, pid) and since when, for the refusal.
"""

from __future__ import annotations

import getpass
import os
import socket
import threading
import time
from typing import Any, BinaryIO, cast

from ddtree_deploy.config import Config, HostSpec
from ddtree_deploy.converge.hoststate import STATE_DIR
from ddtree_deploy.errors import RefusedError
from ddtree_deploy.transport import Command

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


class HostLock:
    def __init__(self, config: Config, host: HostSpec) -> None:
        self.config, self.host = config, host
        self.holder = (f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        self._stdin = _Stdin()
        self._thread: threading.Thread | None = None
        self._result: dict[str, Any] = {}

    def __enter__(self) -> HostLock:
        from ddtree_deploy.connect import open_transport

        transport = open_transport(self.config, self.host)
        self._transport = transport
        cmd = Command.shell(HOLD, LOCK_FILE, self.holder, sudo=True)

        def hold() -> None:
            try:
                self._result["r"] = transport.run_stream_in(
                    cmd, cast(BinaryIO, self._stdin), timeout=None)
            except Exception as exc:  # reported by __enter__, never lost
                self._result["error"] = exc

        self._thread = threading.Thread(target=hold, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + max(15.0, self.host.connect_timeout + 5)
        while time.monotonic() < deadline:
            if "r" in self._result or "error" in self._result:
                break
            if self._holds():
                return self
            time.sleep(0.2)
        self._stdin.release.set()
        if "error" in self._result:
            raise self._result["error"]
        r = self._result.get("r")
        text = (r.stdout if r is not None else "").replace("BUSY", "").strip()
        raise RefusedError(f"another apply holds {self.host.name}: {text or 'unknown holder'}",
                           hint="wait for it to finish")

    def _holds(self) -> bool:
        from ddtree_deploy.connect import open_transport

        with open_transport(self.config, self.host) as t:
            r = t.run(Command.of("cat", LOCK_FILE, sudo=True), timeout=10)
        return r.ok and r.stdout.strip() == self.holder

    def __exit__(self, *exc: object) -> None:
        self._stdin.release.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._transport.close()
