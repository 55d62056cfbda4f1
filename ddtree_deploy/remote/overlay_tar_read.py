"""Read a tar stream member by member, each file's bytes read once into one reused buffer.

tarfile's stream mode ("r|") copies every byte three or four times on its way out (joins and
slices of its read-ahead, then the file object's buffer) and allocates a new megabyte for each
read; for a lane's gigabytes on a small host that is CPU the stream waits for. Here a member's
content comes as memoryviews of one bytearray, filled by readinto straight from the stream.
Headers are parsed by tarfile itself (TarInfo.frombuf: ustar, GNU and pax forms, checksums);
a pax or GNU long-name header ahead of a member supplies its name and size, as tarfile does.
Bundled with the staging receiver and used by the workstation's fetch. Python >= 3.8, stdlib.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import Any

BLOCK = tarfile.BLOCKSIZE
CHUNK = 1 << 20


class Member:
    """One member: its name, size and type (the content is read with `TarReader.content`)."""

    def __init__(self, name: str, size: int, regular: bool) -> None:
        self.name = name
        self.size = size
        self.regular = regular

    def isfile(self) -> bool:
        return self.regular


class TarReader:
    """Members of the tar on `raw` (a binary stream with readinto), in order."""

    def __init__(self, raw: Any, chunk: int = CHUNK) -> None:
        self._raw = raw
        self._buf = bytearray(chunk)
        self._view = memoryview(self._buf)
        self._skip = 0  # what the last member left unread: its rest and its padding

    def _fill(self, n: int) -> memoryview:
        """Exactly `n` (<= chunk) bytes of the stream; EOFError when it ends first."""
        got = 0
        while got < n:
            k = self._raw.readinto(self._view[got:n])
            if not k:
                raise EOFError(f"the tar stream ended {n - got} bytes short")
            got += k
        return self._view[:n]

    def _small(self, n: int) -> bytes:
        """`n` bytes of an extended header and its padding, as bytes."""
        out = bytearray()
        left = n + (-n % BLOCK)
        while left:
            k = min(left, len(self._buf))
            out += self._fill(k)
            left -= k
        return bytes(out[:n])

    def _pass(self) -> None:
        while self._skip:
            k = min(self._skip, len(self._buf))
            self._fill(k)
            self._skip -= k

    def next(self) -> Member | None:
        """The next member (the previous one's unread bytes skipped), or None at the end."""
        self._pass()
        name: str | None = None
        size: int | None = None
        while True:
            try:
                head = self._fill(BLOCK)
            except EOFError:
                return None  # the two zero blocks may be cut by a closed stream: an end too
            block = bytes(head)
            if block.count(0) == BLOCK:  # a zero block: the end of the archive
                return None
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            if info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
                fields = _pax(self._small(info.size))
                name = fields.get("path", name)
                if "size" in fields:
                    size = int(fields["size"])
                continue
            if info.type == tarfile.XGLTYPE:  # global settings: nothing this tool writes
                self._small(info.size)
                continue
            if info.type == tarfile.GNUTYPE_LONGNAME:
                name = self._small(info.size).rstrip(b"\0").decode("utf-8", "surrogateescape")
                continue
            member = Member(info.name if name is None else name,
                            info.size if size is None else size, info.isreg())
            data = member.size if member.regular else 0  # other types carry no content
            self._skip = data + (-data % BLOCK)
            return member

    def content(self, member: Member) -> Iterator[memoryview]:
        """The member's bytes (only right after `next` returned it), chunk by chunk: each view
        is valid until the next one is asked for."""
        left = member.size if member.regular else 0
        while left:
            k = min(left, len(self._buf))
            view = self._fill(k)
            left -= k
            self._skip -= k
            yield view
        pad = self._skip
        if pad:
            self._fill(pad)
            self._skip = 0

    def __iter__(self) -> Iterator[Member]:
        while True:
            member = self.next()
            if member is None:
                return
            yield member


def _pax(data: bytes) -> dict[str, str]:
    """The records of a pax extended header: b"LEN key=value\\n" each."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        if length <= 0:
            raise tarfile.HeaderError("bad pax record length")
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out
