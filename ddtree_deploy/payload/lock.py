"""The venv's payload lock, held on the host for as long as a deploy, upgrade or rollback runs.

The host-side script's `hold` op takes an flock on the venv's folder and keeps it while its
stdin stays open; this side keeps that stdin open until the context ends, so a killed CLI or a
dropped connection releases the lock with the session. Its first answer says LOCKED (with the
temporaries it swept and an install cut short that it undid) or busy (with the holder's text):
a second command on the same venv is refused at once (exit 2), never interleaved.
"""

from __future__ import annotations

import json
import threading
from typing import Any, BinaryIO, cast

from ddtree_deploy.errors import DeployError, ExitCode, RefusedError
from ddtree_deploy.payload.state import PayloadRefused, command, python_of, request
from ddtree_deploy.transport.base import ExecTransport, Result

WAIT_S = 60.0


class PayloadBusy(RefusedError):
    exit_code = ExitCode.USAGE


class _Stdin:
    """The request line, then nothing until released (EOF)."""

    def __init__(self, first: bytes) -> None:
        self.first: bytes | None = first
        self.release = threading.Event()

    def read(self, size: int = -1) -> bytes:
        if self.first is not None:
            data, self.first = self.first, None
            return data
        self.release.wait()
        return b""


class _Watch:
    def __init__(self) -> None:
        self.text = bytearray()
        self.answered = threading.Event()

    def write(self, data: bytes) -> int:
        if len(self.text) < 1 << 20:
            self.text += data
        if b"\n" in self.text:
            self.answered.set()
        return len(data)

    def flush(self) -> None:
        return None


class VenvLock:
    """`with VenvLock(t, venv, rels) as lock:` ... `lock.token` goes with each write op."""

    def __init__(self, t: ExecTransport, venv: str, rels: list[str]) -> None:
        self.t, self.venv, self.rels = t, venv, rels
        self.token = ""  # the holding process's pid on the host, which the write ops check
        self._stdin = _Stdin(request(venv, "hold", package="sglang", rels=rels))
        self._watch = _Watch()
        self._thread: threading.Thread | None = None
        self._error: list[BaseException] = []
        self._result: Result | None = None
        self.swept: list[str] = []
        self.recovered: str | None = None

    def __enter__(self) -> VenvLock:
        cmd = command(self.venv)

        def hold() -> None:
            try:
                self._result = self.t.run_piped(cmd, cast(BinaryIO, self._stdin),
                                                cast(BinaryIO, self._watch), timeout=None)
            except Exception as exc:  # reported by __enter__
                self._error.append(exc)
            finally:
                self._watch.answered.set()

        self._thread = threading.Thread(target=hold, daemon=True)
        self._thread.start()
        self._watch.answered.wait(timeout=WAIT_S)
        try:
            result = self._answer()
        except BaseException:
            self._stop()
            raise
        if "busy" in result:
            self._stop()
            raise PayloadBusy(f"{self.venv} on {self.t.host}: another payload command holds the "
                              f"venv's lock ({result['busy']})", hint="wait for it to finish")
        self.token = str(result.get("token", ""))
        self.swept = [str(p) for p in result.get("swept") or []]
        self.recovered = result.get("recovered")
        return self

    def _answer(self) -> dict[str, Any]:
        line = bytes(self._watch.text).split(b"\n", 1)[0].decode("utf-8", "replace")
        try:
            doc = json.loads(line) if line else None
        except ValueError:
            doc = None
        if self._error and doc is None:
            raise self._error[0]
        result = doc.get("result") if isinstance(doc, dict) and doc.get("ddtree_payload") == 1 \
            else None
        r = self._result
        if result is None and r is not None and not line and (
                r.exit_code == 127 or "No such file" in r.stderr):
            raise PayloadRefused(f"{self.venv} on {self.t.host} is not a venv (no "
                                 f"{python_of(self.venv)})")
        if not isinstance(result, dict):
            shown = repr(line[:200]) if line else "nothing"
            raise PayloadRefused(f"{self.venv} on {self.t.host}: the venv's python did not "
                                 f"answer the payload tool's JSON (it said {shown})")
        if isinstance(result.get("refused"), str):
            raise PayloadRefused(f"{self.venv} on {self.t.host}: refused: {result['refused']}")
        if isinstance(result.get("error"), str):
            raise DeployError(f"{self.venv} on {self.t.host}: the payload lock failed: "
                              f"{result['error']}")
        return result

    def _stop(self) -> None:
        self._stdin.release.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __exit__(self, *exc: object) -> None:
        self._stop()
