"""The payload's host side: one stdlib script run by the venv's own python (`python -I -`).

payload/state.py sends this file with the request appended as a literal (`main({...})`), so a
whole install is one round trip; importing it only defines (the workstation reads STATE_DIR).
The script answers one JSON object: the result, {"refused": why} or
{"error": why}. It trusts nothing it is sent or reads: every path it reads, writes or
deletes is resolved (realpath) and must lie inside the venv (state, backups) or the target
package (the payload's files) before it acts; a backup or package folder a request or the
state file names must resolve to the one this venv really has; files it reads are regular
files (a FIFO or /dev/zero named in a tampered state is refused, never read) of bounded size.

Ops:
  locate  -- the package folder, sglang's version, each named file's sha256 (or symlink),
             torch present, the state file's text (parsed by the workstation);
  backup  -- a recorded backup: its manifest and each backed-up file's sha256 and, on
             request, contents;
  read    -- named package files' contents;
  install -- back up the originals not yet in the backup, write the backup manifest, the
             state, then each file (beside its target, then renamed over it: a symlink is
             replaced, never written through), restore and remove what the old payload
             touched and the new one does not, clear stale __pycache__;
  restore -- put every original back from a backup (symlinks as symlinks), remove what the
             payload added, clear __pycache__, check, then drop the state and the backup.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import sysconfig

STATE_DIR = ".ddtree-deploy"
MAX_DOC = 1 << 20
MAX_FILE = 64 << 20
PART = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"
REL = re.compile(rf"^{PART}(?:/{PART})*$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")
PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


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


class Venv:
    def __init__(self, package):
        if not isinstance(package, str) or not PACKAGE.match(package):
            raise Refused(f"{package!r} is not a package name")
        self.prefix = os.path.realpath(sys.prefix)
        self.purelib = sysconfig.get_paths()["purelib"]
        real_inside(self.purelib, self.prefix, "site-packages")
        self.package = package
        pkg = os.path.join(self.purelib, package)
        self.pkg = real_inside(pkg, self.prefix, "the package folder") \
            if os.path.isdir(pkg) else None
        self.state_dir = os.path.join(self.prefix, STATE_DIR)
        if os.path.lexists(self.state_dir):
            self.state_dir = real_inside(self.state_dir, self.prefix, "the state folder")
        self.state_path = os.path.join(self.state_dir, "payload.json")
        self.backups = os.path.join(self.state_dir, "backups")

    def need_pkg(self):
        if self.pkg is None:
            raise Refused(f"{sys.prefix} has no package folder {self.package}")
        return self.pkg

    def target(self, rel):
        """(path to write, kind): kind None (absent), "file" or "link"."""
        pkg = self.need_pkg()
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


def sha(data):
    return hashlib.sha256(data).hexdigest()


def entry_of(path, kind, venv):
    """An original as the backup records it: sha256 and, for a symlink, its text."""
    if kind is None:
        return None
    data = read_small(os.path.realpath(path), MAX_FILE, "file")
    return {"sha256": sha(data), "link": os.readlink(path) if kind == "link" else None}


def backup_manifest(bdir):
    """rel -> original entry (None: the payload added it). Reads both formats: version 2
    {"format": 2, "originals": {rel: {sha256, link} | None}} and the first {rel: sha | None}."""
    doc = json.loads(read_small(os.path.join(bdir, "manifest.json"), MAX_DOC,
                                "the backup manifest").decode("utf-8"))
    if isinstance(doc, dict) and doc.get("format") == 2:
        doc = doc.get("originals")
    if not isinstance(doc, dict):
        raise Refused(f"the backup manifest in {bdir} is not a mapping")
    out = {}
    for rel, e in doc.items():
        rel_ok(rel)
        if isinstance(e, str):
            e = {"sha256": e, "link": None}
        if e is not None and not (isinstance(e, dict) and isinstance(e.get("sha256"), str)
                                  and isinstance(e.get("link"), (str, type(None)))):
            raise Refused(f"the backup manifest in {bdir}: {rel} has no valid entry")
        out[rel] = None if e is None else {"sha256": e["sha256"], "link": e.get("link")}
    return out


def backup_file(bdir, rel, e):
    """Path of a backed-up original, checked to lie inside the backup (a symlink is kept as
    a symlink there: its text is checked against the manifest, never followed)."""
    rel_ok(rel)
    files = os.path.join(bdir, "files")
    path = os.path.join(real_inside(os.path.dirname(os.path.join(files, rel)), bdir,
                                    "the backup folder of"), os.path.basename(rel))
    if e["link"] is not None:
        if not os.path.islink(path) or os.readlink(path) != e["link"]:
            raise Refused(f"backup of {rel} is not the symlink it recorded")
        return path
    read_small(path, MAX_FILE, "the backup of")  # a regular file, not a link out
    return path


def write_atomic(path, data, mode=0o644):
    tmp = f"{path}.ddtree-tmp-{os.getpid():d}"
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
    tmp = f"{path}.ddtree-tmp-{os.getpid():d}"
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


def version_of(v):
    want = v.package.replace("-", "_").lower()
    for entry in sorted(os.listdir(v.purelib)):
        if entry.endswith(".dist-info") and entry.split("-")[0].lower() == want:
            try:
                text = read_small(os.path.join(v.purelib, entry, "METADATA"), MAX_DOC,
                                  "METADATA").decode("utf-8", "replace")
            except (OSError, Refused):
                continue
            for line in text.splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None


def op_locate(req):
    v = Venv(req["package"])
    out = {"prefix": v.prefix, "purelib": v.purelib, "package_dir": v.pkg,
           "version": version_of(v), "files": {}, "links": {}, "state": None,
           "state_error": None}
    if v.pkg is not None:
        for rel in req.get("rels", []):
            path, kind = v.target(rel)
            e = entry_of(path, kind, v)
            out["files"][rel] = e and e["sha256"]
            if kind == "link":
                out["links"][rel] = e["link"]
    out["torch"] = os.path.isdir(os.path.join(v.purelib, "torch"))
    if os.path.lexists(v.state_path):
        try:
            out["state"] = read_small(v.state_path, MAX_DOC, "the payload state").decode(
                "utf-8", "replace")
        except Refused as exc:
            out["state_error"] = str(exc)
    return out


def op_backup(req):
    v = Venv(req["package"])
    bdir = v.recorded_backup(req["backup"])
    originals = backup_manifest(bdir)
    files, content = {}, {}
    for rel, e in originals.items():
        if e is None:
            continue
        path = backup_file(bdir, rel, e)
        if e["link"] is not None:  # kept as a link: its upstream bytes are where it leads
            target, _ = v.target(rel)
            path = real_inside(os.path.join(os.path.dirname(target), e["link"]), v.pkg,
                               "the symlink")
        data = read_small(path, MAX_FILE, "the backup of")
        files[rel] = sha(data)
        if rel in req.get("want", []):
            content[rel] = base64.b64encode(data).decode()
    return {"backup": bdir, "originals": originals, "files": files, "content": content}


def op_read(req):
    v = Venv(req["package"])
    out = {}
    for rel in req["rels"]:
        path, kind = v.target(rel)
        if kind is None:
            raise Refused(f"{path} is missing")
        out[rel] = base64.b64encode(read_small(os.path.realpath(path), MAX_FILE,
                                               "file")).decode()
    return {"content": out}


def restore_one(v, bdir, rel, e):
    path, kind = v.target(rel)
    if e is None:
        if kind is not None:
            os.unlink(path)
        return
    src = backup_file(bdir, rel, e)
    if e["link"] is not None:
        link_atomic(path, e["link"])
    else:
        write_atomic(path, read_small(src, MAX_FILE, "the backup of"),
                     stat.S_IMODE(os.stat(src).st_mode) or 0o644)


def op_install(req):
    v = Venv(req["package"])
    pkg = v.need_pkg()
    state = req["state"]
    v.recorded_package(state["package_dir"])
    backups = v.ensure_dir(v.prefix, [STATE_DIR, "backups"])
    v.state_dir = os.path.dirname(backups)
    v.state_path = os.path.join(v.state_dir, "payload.json")
    v.backups = backups
    new = req.get("new_backup")
    if new is not None:
        if not NAME.match(new):
            raise Refused(f"{new!r} is not a backup folder name")
        bdir = os.path.join(backups, new)
        os.mkdir(bdir, 0o700)
        originals = {}
    else:
        bdir = v.recorded_backup(req["backup"])
        originals = backup_manifest(bdir)
    try:
        for rel, e in req["originals"].items():
            if rel in originals:
                continue
            path, kind = v.target(rel)
            have = entry_of(path, kind, v)
            if (have and have["sha256"]) != (e and e["sha256"]):
                raise Refused(f"{path} changed while the payload was being installed")
            if have is not None:
                dest = v.ensure_dir(bdir, ["files"] + rel.split("/")[:-1])
                dest = os.path.join(dest, os.path.basename(rel))
                if kind == "link":
                    os.symlink(have["link"], dest)
                else:
                    write_atomic(dest, read_small(os.path.realpath(path), MAX_FILE, "file"),
                                 stat.S_IMODE(os.stat(path).st_mode) or 0o644)
            originals[rel] = have
        write_atomic(os.path.join(bdir, "manifest.json"),
                     json.dumps({"format": 2, "originals": originals}, indent=1).encode())
    except BaseException:
        if new is not None:
            shutil.rmtree(bdir, ignore_errors=True)
        raise
    state["backup"] = bdir
    write_atomic(v.state_path, json.dumps(state, indent=1).encode())
    for rel in req["restore"]:
        restore_one(v, bdir, rel, originals[rel])
    for rel, b64 in req["files"].items():
        path, _ = v.target(rel)
        write_atomic(path, base64.b64decode(b64))
    touched = list(req["files"]) + list(req["restore"])
    return {"backup": bdir, "pycache_removed": clear_pycache(pkg, touched)}


def op_restore(req):
    v = Venv(req["package"])
    pkg = v.recorded_package(req["package_dir"])
    bdir = v.recorded_backup(req["backup"])
    originals = backup_manifest(bdir)
    for rel, e in originals.items():  # every check first: a refused restore touches nothing
        v.target(rel)
        if e is not None:
            backup_file(bdir, rel, e)
    for rel, e in originals.items():
        restore_one(v, bdir, rel, e)
    clear_pycache(pkg, list(originals))
    wrong = []
    for rel, e in originals.items():
        path, kind = v.target(rel)
        have = entry_of(path, kind, v)
        if (have and (have["sha256"], have["link"])) != (e and (e["sha256"], e["link"])):
            wrong.append(rel)
    if wrong:
        return {"wrong": wrong}
    if os.path.lexists(v.state_path):
        os.unlink(v.state_path)
    shutil.rmtree(bdir)
    return {"restored": sorted(r for r, e in originals.items() if e is not None),
            "removed": sorted(r for r, e in originals.items() if e is None)}


OPS = {"locate": op_locate, "backup": op_backup, "read": op_read, "install": op_install,
       "restore": op_restore}


def main(text):
    try:
        req = json.loads(text)
        out = OPS[req["op"]](req)
    except Refused as exc:
        out = {"refused": str(exc)}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps({"ddtree_payload": 1, "result": out}) + "\n")
