"""Deleting the lab's folders without ever deleting through a mount point.

`shutil.rmtree` follows into a mounted file system: run over a folder that holds
a live container's overlay root it deletes that container's files. Every removal
in the lab goes through `remove_tree`, which refuses when anything is mounted at
or below the folder (from /proc/self/mountinfo) or when a folder below it lies on
another device (st_dev), before deleting anything.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from ddtree_lab.errors import LabError

MOUNTINFO = "/proc/self/mountinfo"


class MountedError(LabError):
    """A folder to delete holds a mount point."""


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (octal)
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str = MOUNTINFO) -> list[Path]:
    with open(mountinfo, encoding="utf-8") as fh:
        return [Path(_unescape(line.split()[4])) for line in fh if len(line.split()) > 4]


def mounts_under(root: Path, mountinfo: str = MOUNTINFO) -> list[Path]:
    """Mount points at or below root, deepest first."""
    prefix = str(Path(root).resolve())
    found = [p for p in mount_points(mountinfo)
             if str(p) == prefix or str(p).startswith(prefix.rstrip("/") + "/")]
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def _other_device(root: Path) -> Path | None:
    """The first folder below root on another device than root, or None."""
    dev = os.lstat(root).st_dev
    for top, dirs, _files in os.walk(root):
        for d in dirs:
            p = os.path.join(top, d)
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode) and st.st_dev != dev:
                return Path(p)
    return None


def remove_tree(path: Path, mountinfo: str = MOUNTINFO) -> None:
    """Delete `path` (a folder, or a file), refusing if a mount lies at or below it."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    mounted = mounts_under(path, mountinfo)
    crossing = mounted[-1] if mounted else _other_device(path)
    if crossing is not None:
        raise MountedError(
            f"refusing to delete {path}: {crossing} is a mount point",
            hint="unmount it first (`ddtree-deploy lab down` unmounts the lab's own)")
    try:
        shutil.rmtree(path)
    except OSError as exc:
        raise LabError(f"cannot delete {path}: {exc}") from exc
