"""Files the tool replaces whole: written beside their target, then renamed over it.

One writer for the files the tool keeps for itself (the facts cache, bench results) and
the user's files it edits (hosts.yaml by `bench recommend --write`):

- the new content goes to a temporary file in the target's folder (so the rename is
  atomic) that is removed on every failure: an exception, a full disk, Ctrl-C, and
  SIGTERM (turned into an exception while the file is being written, in the main thread),
  so no empty or partial `*.tmp` is ever left behind;
- `through_link=True`: a target that is a symlink is written through: the file it resolves
  to is replaced and the link stays a link (a hosts.yaml shared by a link);
- `keep=True`: the replaced file's owner, group and mode are kept;
- a failure is one `FileWriteError` (exit 1) naming the path and the reason ("No space
  left on device"), never blamed on a host.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from ddtree_deploy.errors import DeployError, ExitCode

__all__ = ["FileWriteError", "Terminated", "replace_file"]


class FileWriteError(DeployError):
    """A file of the tool's (or one it edits) could not be written."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None, reason: str = "") -> None:
        super().__init__(message, hint=hint)
        self.reason = reason  # the system's words alone ("No space left on device")


class Terminated(SystemExit):
    """SIGTERM arrived while a file was being replaced (the temporary is removed first)."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def replace_file(path: Path, data: bytes, *, mode: int = 0o644, keep: bool = False,
                 through_link: bool = False, sync: bool = False) -> Path:
    """Replace `path` with `data` atomically; returns the path of the file written."""
    target = Path(os.path.realpath(path)) if through_link else path
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FileWriteError(f"cannot write {path}: {_why(exc)} (making {target.parent})"
                             ) from None
    old = None
    if keep:
        try:
            old = target.stat()
        except FileNotFoundError:
            old = None
        except OSError as exc:
            raise FileWriteError(f"cannot write {path}: {_why(exc)}") from None
    tmp: str | None = None
    with _sigterm_raises():
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                       dir=target.parent)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                if sync:
                    os.fsync(fh.fileno())
            if old is not None:
                if (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
                    try:
                        os.chown(tmp, old.st_uid, old.st_gid)
                    except PermissionError as exc:
                        raise FileWriteError(
                            f"cannot write {path} keeping its owner ({old.st_uid}:"
                            f"{old.st_gid}): {_why(exc)}",
                            hint="run as that user (or root), or edit the file by hand") from None
                os.chmod(tmp, old.st_mode & 0o7777)
            else:
                os.chmod(tmp, mode)
            os.replace(tmp, target)
            tmp = None
        except OSError as exc:
            where = f"{path}" if target == path else f"{path} (the file it links to, {target})"
            raise FileWriteError(f"cannot write {where}: {_why(exc)}", reason=_why(exc)) from None
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
    return target
