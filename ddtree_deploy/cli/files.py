"""Files named on the command line (`plan --out FILE`, `apply --plan FILE`), read and
written so that a careless name cannot hang, crash or leave half a file.

- an output is checked before the work starts (an empty name, a folder, a missing
  parent folder are usage errors, exit 2), then written to a temporary file next to it
  and renamed over it: a full disk leaves the old file (or none), never a partial one.
  A FIFO with no reader is refused at once instead of blocking; a device (/dev/null,
  /dev/stdout) is written in place;
- an input must be a regular file of bounded size (a FIFO or /dev/zero is refused
  without being read).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ddtree_deploy.errors import DeployError, UsageError

MAX_INPUT_BYTES = 64 << 20


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def output_path(value: str, flag: str) -> Path:
    """The path given to ``flag``, checked before any work is done."""
    if not value.strip():
        raise UsageError(f"{flag} {value!r}: expected a file name")
    path = Path(value).expanduser()
    try:
        st = path.stat()
    except FileNotFoundError:
        parent = path.parent
        if not parent.is_dir():
            raise UsageError(f"{flag} {value}: the folder {parent} does not exist") from None
        return path
    except OSError as exc:
        raise UsageError(f"{flag} {value}: {_why(exc)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{flag} {value}: is a folder, expected a file name")
    return path


def write_output(path: Path, text: str, flag: str) -> None:
    """Write ``text`` to ``path`` (checked by output_path): atomically for a regular file."""
    data = text.encode("utf-8")
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_special(path, data, flag)
        return
    from ddtree_deploy.atomicfile import FileWriteError, replace_file

    try:  # the one atomic writer: no temporary left, SIGTERM and a full disk included
        replace_file(path, data, keep=True, sync=True)
    except FileWriteError as exc:
        raise DeployError(f"{flag} {path}: cannot write: {exc.reason or exc.message}") from None


def _write_special(path: Path, data: bytes, flag: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise UsageError(f"{flag} {path}: a pipe with no reader") from None
        raise DeployError(f"{flag} {path}: cannot write: {_why(exc)}") from None
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise DeployError(f"{flag} {path}: cannot write: {_why(exc)}") from None
    finally:
        os.close(fd)


def read_input(value: Path, flag: str) -> str:
    """The UTF-8 text of a regular file of at most MAX_INPUT_BYTES."""
    try:
        fd = os.open(value, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:
        why = _why(exc) if isinstance(exc, OSError) else str(exc)
        raise UsageError(f"{flag} {value}: cannot read: {why}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{flag} {value}: not a regular file (a folder, pipe or device)")
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(MAX_INPUT_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"{flag} {value}: cannot read: {_why(exc)}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise UsageError(f"{flag} {value}: larger than {MAX_INPUT_BYTES >> 20} MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag} {value}: not UTF-8 text (byte at offset {exc.start})") from None
