"""The venv the payload tool works on, its lock and its journal (a part of remote/payload.py's
bundle).

The venv is the one the workstation named: the resolved `sys.prefix` of the python that runs
this script must be that folder (a `bin/python` that runs another venv's python is refused,
never written through). Writes happen under the venv's lock: an flock on the venv's folder itself
(nothing written for it), taken by the `hold` op, which keeps it for as long as its stdin stays
open (the workstation's session), so a killed command releases it; the ops that write check
that it is held, by their holder. An install notes what it is doing in `.ddtree-deploy/pending.json`
before it touches a file and drops the note after the state is written, so an install cut short
(SIGKILL, power) is found by the next holder and undone (`recover`).
"""

import errno
import fcntl
import json
import os
import stat
import sys
import sysconfig

from ddtree_deploy.remote.payload_fs import (
    MAX_DOC,
    NAME,
    PACKAGE,
    STATE_DIR,
    Refused,
    read_small,
    real_inside,
    rel_ok,
    write_atomic,
)

PENDING = "pending.json"
PROC_LOCKS = "/proc/locks"  # where the kernel lists each lock's holder
UNKNOWN_HOLDER = "a process of this host"


def own_prefix(venv):
    """sys.prefix resolved, refused unless it is the venv the workstation named."""
    prefix = os.path.realpath(sys.prefix)
    if not isinstance(venv, str) or not venv.startswith("/"):
        raise Refused(f"{venv!r} is not an absolute venv path")
    if os.path.realpath(venv) != prefix:
        raise Refused(f"the python of {venv} is not its own: it runs with sys.prefix {prefix} "
                      f"(its bin/python starts another environment's interpreter)")
    return prefix


class Venv:
    def __init__(self, package, venv):
        if not isinstance(package, str) or not PACKAGE.match(package):
            raise Refused(f"{package!r} is not a package name")
        self.prefix = own_prefix(venv)
        self.purelib = sysconfig.get_paths()["purelib"]
        real_inside(self.purelib, self.prefix, "site-packages")
        self.purelib = os.path.realpath(self.purelib)
        self.package = package
        pkg = os.path.join(self.purelib, package)
        self.pkg = real_inside(pkg, self.prefix, "the package folder") \
            if os.path.isdir(pkg) else None
        self.state_dir = os.path.join(self.prefix, STATE_DIR)
        if os.path.lexists(self.state_dir):
            self.state_dir = real_inside(self.state_dir, self.prefix, "the state folder")
        self.state_path = os.path.join(self.state_dir, "payload.json")
        self.backups = os.path.join(self.state_dir, "backups")
        self.pending_path = os.path.join(self.state_dir, PENDING)

    def need_pkg(self):
        if self.pkg is None:
            raise Refused(f"{sys.prefix} has no package folder {self.package}")
        return self.pkg

    def target(self, rel, root=None):
        """(path to write, kind): kind None (absent), "file" or "link"; inside `root`
        (default: the package)."""
        pkg = root or self.need_pkg()
        rel_ok(rel)
        path = os.path.join(pkg, rel)
        parent = real_inside(os.path.dirname(path), pkg, "the folder of")
        path = os.path.join(parent, os.path.basename(path))
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return path, None
        if stat.S_ISLNK(st.st_mode):
            real_inside(path, pkg, "the symlink")
            if not os.path.isfile(path):
                raise Refused(f"the symlink {path} does not lead to a regular file")
            return path, "link"
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is not a regular file")
        return path, "file"

    def ensure_dir(self, root, parts):
        cur = root
        for part in parts:
            cur = os.path.join(cur, part)
            if not os.path.lexists(cur):
                os.mkdir(cur, 0o755)
            cur = real_inside(cur, root, "the folder")
            if not os.path.isdir(cur):
                raise Refused(f"{cur} is not a folder")
        return cur

    def ensure_state_dir(self):
        self.state_dir = self.ensure_dir(self.prefix, [STATE_DIR])
        self.state_path = os.path.join(self.state_dir, "payload.json")
        self.backups = os.path.join(self.state_dir, "backups")
        self.pending_path = os.path.join(self.state_dir, PENDING)
        return self.state_dir

    def recorded_backup(self, recorded):
        """The backup folder a state names, proven to be one of this venv's backups."""
        if not isinstance(recorded, str) or not recorded:
            raise Refused("the state names no backup folder")
        root = real_inside(self.backups, self.prefix, "the backups folder")
        real = os.path.realpath(recorded)
        if os.path.dirname(real) != root \
                or not NAME.match(os.path.basename(real)):
            raise Refused(f"the state names backup folder {recorded}, which is not this venv's "
                          f"(in {self.backups})")
        if not os.path.isdir(real):
            raise Refused(f"backup folder {recorded} is missing")
        return real

    def recorded_package(self, recorded):
        pkg = self.need_pkg()
        if not isinstance(recorded, str) or os.path.realpath(recorded) != pkg:
            raise Refused(f"the state names package folder {recorded!r}, which is not this "
                          f"venv's {pkg}")
        return pkg

    # -- the lock ---------------------------------------------------------------------------

    def _lock_fd(self):
        return os.open(self.prefix, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))

    def take_lock(self):
        """The venv folder's open descriptor, flock'ed (nothing is written for it); None when
        another process holds it (then `holder_text()` says which)."""
        fd = self._lock_fd()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise
        return fd

    def holder_text(self):
        """Who holds the venv's flock, from /proc/locks (pid and command line)."""
        try:
            ino = os.stat(self.prefix).st_ino
            with open(PROC_LOCKS, encoding="ascii", errors="replace") as fh:
                rows = fh.read(1 << 20).splitlines()
        except OSError:
            return UNKNOWN_HOLDER
        for row in rows:
            parts = row.split()
            if len(parts) > 5 and parts[1] == "FLOCK" and parts[5].endswith(f":{ino}"):
                pid = parts[4]
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmd = fh.read(300).replace(b"\0", b" ").decode("utf-8", "replace")
                except OSError:
                    cmd = "?"
                return f"pid {pid}: {cmd.strip()[:120]}"
        return UNKNOWN_HOLDER

    def check_lock(self, token):
        """Refuse unless the venv's lock is held (by the `hold` of this command: its token is
        the holder's pid)."""
        if not isinstance(token, str) or not token.isdecimal():
            raise Refused("a write without the venv's lock")
        fd = self._lock_fd()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            held = self.holder_text()
            if held.startswith("pid "):
                if held.split(":", 1)[0] != f"pid {token}":
                    raise Refused(f"the venv's lock is held by another command ({held})") \
                        from None
                return
            if self._opened_by(token):  # /proc/locks did not say: the holder's own folder fd
                return
            raise Refused(
                f"the venv's lock on {self.prefix} is held, and its holder cannot be identified "
                f"({PROC_LOCKS} names none, and pid {token}, the lock this command took, has "
                f"no descriptor on the folder): check which process holds it with `fuser -v "
                f"{self.prefix}` or `lsof {self.prefix}`. The lock is an flock: it ends with "
                "its process, so a stale one is cleared by ending that process (a payload "
                "command cut short), then run the command again") from None
        finally:
            os.close(fd)
        raise Refused("the venv's lock is not held (its holder ended)")

    def _opened_by(self, pid):
        """Whether process `pid` has a descriptor open on the venv's folder."""
        where = f"/proc/{pid}/fd"
        try:
            names = os.listdir(where)
        except OSError:
            return False
        for name in names:
            try:
                if os.path.realpath(os.readlink(os.path.join(where, name))) == self.prefix:
                    return True
            except OSError:
                continue
        return False

    # -- the journal ------------------------------------------------------------------------

    def note_pending(self, doc):
        write_atomic(self.pending_path, json.dumps(doc).encode())

    def clear_pending(self):
        if os.path.lexists(self.pending_path):
            os.unlink(self.pending_path)

    def pending(self):
        """The note of an install cut short, or None."""
        if not os.path.lexists(self.pending_path):
            return None
        doc = json.loads(read_small(self.pending_path, MAX_DOC, "the install note")
                         .decode("utf-8"))
        if not isinstance(doc, dict):
            raise Refused(f"{self.pending_path} is not a mapping")
        return doc
