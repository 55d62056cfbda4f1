"""A command's output told line by line while it runs (apply -vv, apply's status line).

`Lines` is fed the raw chunks of a command's collected standard output and standard error
as the transport reads them; it cuts them into lines (a newline or a carriage return ends
one: a progress redraw is a line), masks the secret values in each and tells every
listener `(command, stream, line)`, stream being "out" or "err". A line that never ends is
told in pieces of at most `LINE_MAX` bytes. Output streamed elsewhere (a tar stream) is
never fed here.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable

from ddtree_deploy.transport.command import mask_secrets

#: told of each line a command prints while it runs: (its display form, "out" or "err",
#: the line with secrets masked)
Listener = Callable[[str, str, str], None]

LINE_MAX = 16 * 1024
_END = re.compile(rb"\r\n|\r|\n")


class Lines:
    """Cuts a running command's output into masked lines for its transport's listeners."""

    def __init__(self, command: str, secrets: Iterable[str],
                 listeners: tuple[Listener, ...]) -> None:
        self._command = command
        self._secrets = frozenset(s for s in secrets if s)
        self._raw = [s.encode() for s in self._secrets]
        self._keep = max((len(s) for s in self._raw), default=0)
        self._listeners = listeners
        self._pending = {"out": b"", "err": b""}
        self._lock = threading.Lock()

    def feed(self, stream: str, data: bytes) -> None:
        """Chunks of `stream` ("out" or "err") as they are read (from any thread)."""
        with self._lock:
            buf = self._pending[stream] + data
            lines = _END.split(buf)
            buf = lines.pop()
            while len(buf) > LINE_MAX + self._keep:
                cut = self._cut(buf)
                lines.append(buf[:cut])
                buf = buf[cut:]
            self._pending[stream] = buf
            for line in lines:
                self._tell(stream, line)

    def _cut(self, buf: bytes) -> int:
        """Where a piece of a long line ends: LINE_MAX, or before a secret it would cut."""
        cut = LINE_MAX
        for secret in self._raw:
            start = buf.find(secret, max(cut - len(secret) + 1, 0), cut + len(secret))
            if 0 < start < cut:
                cut = start
        return cut

    def flush(self) -> None:
        """The last lines that had no end: the command is over."""
        with self._lock:
            for stream, buf in self._pending.items():
                if buf:
                    self._tell(stream, buf)
                self._pending[stream] = b""

    def _tell(self, stream: str, raw: bytes) -> None:
        line = mask_secrets(raw.decode("utf-8", errors="replace"), self._secrets).rstrip()
        if not line.strip():
            return
        for listen in self._listeners:
            listen(self._command, stream, line)
