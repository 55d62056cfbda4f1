"""The payload tool's file primitives on the host (a part of remote/payload.py's bundle).

Every path it reads, writes or deletes is resolved (realpath) and must lie inside the root it
belongs to; files it reads are regular files (never a FIFO or a device) of bounded size; files
it writes go beside their target under a temporary name of its own (`*.ddtree-tmp-*`, swept
under the venv's lock by `sweep_temporaries`) and are renamed over it.
"""

import hashlib
import os
import re
import stat

STATE_DIR = ".ddtree-deploy"
TMP_MARK = ".ddtree-tmp-"
MAX_DOC = 1 << 20
MAX_FILE = 64 << 20
PART = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"
REL = re.compile(rf"{PART}(?:/{PART})*\Z")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}\Z")  # \Z: `$` passes a final newline
PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


class Refused(Exception):
    pass


def inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def real_inside(path, root, what):
    real = os.path.realpath(path)
    if not inside(real, root):
        raise Refused(f"{what} {path} resolves to {real}, outside {root}")
    return real


def rel_ok(rel):
    if not isinstance(rel, str) or not REL.match(rel) or ".." in rel.split("/"):
        raise Refused(f"{rel!r} is not a plain relative path")
    return rel


def read_small(path, limit, what):
    """A regular file's bytes (never a FIFO, device or folder), at most `limit`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last part is a symlink
            raise Refused(f"{what} {path} is a symlink") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{what} {path} is not a regular file")
        if st.st_size > limit:
            raise Refused(f"{what} {path} is larger than {limit:d} bytes")
        return fh.read(limit + 1)[:limit]


def sha(data):
    return hashlib.sha256(data).hexdigest()


def tmp_name(path):
    return f"{path}{TMP_MARK}{os.getpid():d}-{os.urandom(4).hex()}"


def write_atomic(path, data, mode=0o644):
    tmp = tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def link_atomic(path, text):
    tmp = tmp_name(path)
    os.symlink(text, tmp)
    os.replace(tmp, path)


def clear_pycache(pkg, rels):
    removed = 0
    for rel in rels:
        if not rel.endswith(".py"):
            continue
        folder = os.path.join(pkg, os.path.dirname(rel), "__pycache__")
        if not os.path.isdir(folder) or not inside(os.path.realpath(folder), pkg):
            continue
        stem = os.path.basename(rel)[:-3] + "."
        for name in os.listdir(folder):
            if name.startswith(stem) and name.endswith(".pyc"):
                os.unlink(os.path.join(folder, name))
                removed += 1
    return removed


def _drop_tmp(folder, name, root, out):
    path = os.path.join(folder, name)
    if TMP_MARK not in name or not inside(os.path.realpath(folder), root):
        return
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
        os.unlink(path)
        out.append(path)


def sweep_temporaries(pkg, rels, state_dir):
    """Remove this tool's own temporaries (`<file>.ddtree-tmp-*`, regular files or symlinks)
    beside each of `rels` in `pkg` and anywhere in the venv's state folder; call only under
    the venv's lock (another writer's temporary would be in use). Returns what it removed."""
    out: list[str] = []
    if pkg is not None:
        for rel in sorted(set(rels)):
            folder = os.path.join(pkg, os.path.dirname(rel))
            if not os.path.isdir(folder) or not inside(os.path.realpath(folder), pkg):
                continue
            stem = os.path.basename(rel) + TMP_MARK
            for name in os.listdir(folder):
                if name.startswith(stem):
                    _drop_tmp(folder, name, pkg, out)
    if os.path.isdir(state_dir) and not os.path.islink(state_dir):
        root = os.path.realpath(state_dir)
        for folder, dirs, _files in os.walk(state_dir):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
            for name in os.listdir(folder):
                _drop_tmp(folder, name, root, out)
    return sorted(set(out))
