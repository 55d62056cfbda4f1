"""The payload's host side: one stdlib script run by the venv's own python (`python -I -c`).

The parts (`payload_fs.py`, `payload_venv.py`, `payload_backup.py`, `payload_plugin.py`, this
module) are bundled into one script (payload/state.py); the request comes as the first line of
stdin, so a whole install is one round trip. The script answers one JSON object: the result,
{"refused": why} or {"error": why}. It trusts nothing it is sent or reads: the venv's python
must be the venv's own (its resolved sys.prefix is the venv named); every path it reads, writes
or deletes is resolved (realpath) and must lie inside the venv (state, backups) or the target
package (the payload's files) before it acts; a backup or package folder a request or the state
file names must resolve to the one this venv really has; files it reads are regular files (a
FIFO or /dev/zero named in a tampered state is refused, never read) of bounded size.

Ops:
  hold    -- take the venv's lock (refused with its holder's text when another holds it),
             sweep this tool's own temporaries, undo an install cut short, answer, and keep
             the lock until stdin closes;
  locate  -- the package folder, its version, each named file's sha256 (or symlink), torch
             present, the state file's text (parsed by the workstation), the plugin's
             distribution and entry points;
  backup  -- a recorded backup: its manifest and each backed-up file's sha256 and, on
             request, contents;
  read    -- named package files' contents;
  install -- (locked) back up the originals not yet in the backup, write the backup manifest
             and the install note, then each file (beside its target, then renamed over it: a
             symlink is replaced, never written through), restore what the old payload touched
             and the new one does not, clear stale __pycache__, and only then the state; a
             failure puts the upstream files back;
  retire  -- (locked) after sglang was reinstalled at another version: the patch set's own
             leftovers removed (never a file the new sglang lists), its backup and state dropped;
  restore -- (locked) put every original back from a backup (symlinks as symlinks), remove
             what the payload added, clear __pycache__, check, then drop the state and backup;
  plugin ops: see payload_plugin.py.
"""

import base64
import contextlib
import json
import os
import shutil
import sys

from ddtree_deploy.remote.payload_backup import (
    backup_file,
    backup_manifest,
    drop_backup,
    entry_of,
    restore_all,
    restore_one,
    save_original,
    write_manifest,
)
from ddtree_deploy.remote.payload_fs import (
    MAX_DOC,
    MAX_FILE,
    NAME,
    Refused,
    clear_pycache,
    read_small,
    rel_ok,
    sha,
    sweep_temporaries,
    write_atomic,
)
from ddtree_deploy.remote.payload_plugin import (
    PLUGIN_OPS,
    dist_info,
    plugin_facts,
    record,
    undo_plugin,
)
from ddtree_deploy.remote.payload_venv import Venv

MAX_REQUEST = 256 << 20


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
    v = Venv(req["package"], req["venv"])
    out = {"prefix": v.prefix, "purelib": v.purelib, "package_dir": v.pkg,
           "version": version_of(v), "files": {}, "links": {}, "state": None,
           "state_error": None, "pending": os.path.lexists(v.pending_path)}
    if v.pkg is not None:
        for rel in req.get("rels", []):
            path, kind = v.target(rel)
            e = entry_of(path, kind)
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
    out["plugin"] = plugin_facts(v, req.get("plugin"))
    return out


def op_backup(req):
    v = Venv(req["package"], req["venv"])
    bdir = v.recorded_backup(req["backup"])
    originals = backup_manifest(bdir)
    files, content = {}, {}
    for rel, e in originals.items():
        if e is None:
            continue
        path = backup_file(bdir, rel, e)
        if e["link"] is not None:  # kept as a link: its upstream bytes are where it leads
            target, _ = v.target(rel)
            path = os.path.realpath(os.path.join(os.path.dirname(target), e["link"]))
            if not path.startswith(v.need_pkg() + "/"):
                raise Refused(f"the symlink {target} leads outside {v.pkg}")
        data = read_small(path, MAX_FILE, "the backup of")
        files[rel] = sha(data)
        if rel in req.get("want", []):
            content[rel] = base64.b64encode(data).decode()
    return {"backup": bdir, "originals": originals, "files": files, "content": content}


def op_read(req):
    v = Venv(req["package"], req["venv"])
    out = {}
    for rel in req["rels"]:
        path, kind = v.target(rel)
        if kind is None:
            raise Refused(f"{path} is missing")
        out[rel] = base64.b64encode(read_small(os.path.realpath(path), MAX_FILE,
                                               "file")).decode()
    return {"content": out}


def _new_backup(v, req):
    backups = v.ensure_dir(v.prefix, [os.path.basename(v.state_dir), "backups"])
    v.backups = backups
    new = req.get("new_backup")
    if new is not None:
        if not NAME.match(new):
            raise Refused(f"{new!r} is not a backup folder name")
        bdir = os.path.join(backups, new)
        os.mkdir(bdir, 0o700)
        return bdir, {}, True
    bdir = v.recorded_backup(req["backup"])
    return bdir, backup_manifest(bdir), False


def op_install(req):
    v = Venv(req["package"], req["venv"])
    pkg = v.need_pkg()
    v.check_lock(req.get("lock"))  # before anything is written, the state folder included
    v.ensure_state_dir()
    state = req["state"]
    v.recorded_package(state["package_dir"])
    bdir, originals, fresh = _new_backup(v, req)
    try:
        for rel, e in req["originals"].items():
            if rel in originals:
                continue
            path, kind = v.target(rel)
            have = entry_of(path, kind)
            if (have and have["sha256"]) != (e and e["sha256"]):
                raise Refused(f"{path} changed while the payload was being installed")
            if have is not None:
                save_original(v, bdir, rel, have, path, kind)
            originals[rel] = have
        write_manifest(bdir, originals)
    except BaseException:
        if fresh:
            shutil.rmtree(bdir, ignore_errors=True)
        raise
    v.note_pending({"backup": bdir, "form": "patch"})
    try:
        for rel in req["restore"]:
            restore_one(v, bdir, rel, originals[rel])
        for rel, b64 in req["files"].items():
            path, _ = v.target(rel)
            write_atomic(path, base64.b64decode(b64))
        touched = list(req["files"]) + list(req["restore"])
        removed = clear_pycache(pkg, touched)
        state["backup"] = bdir
        write_atomic(v.state_path, json.dumps(state, indent=1).encode())
        v.clear_pending()
    except (OSError, Refused) as exc:
        _, wrong = restore_all(v, pkg, bdir)
        if not wrong:
            drop_backup(v, bdir)
        raise Refused(f"the install failed ({type(exc).__name__}: {exc}); the upstream files "
                      "were put back" + (f" except {', '.join(wrong)}" if wrong else "")) \
            from None
    return {"backup": bdir, "pycache_removed": removed}


def op_restore(req):
    v = Venv(req["package"], req["venv"])
    v.check_lock(req.get("lock"))
    pkg = v.recorded_package(req["package_dir"])
    bdir = v.recorded_backup(req["backup"])
    originals, wrong = restore_all(v, pkg, bdir)
    if wrong:
        return {"wrong": wrong}
    drop_backup(v, bdir)
    return {"restored": sorted(r for r, e in originals.items() if e is not None),
            "removed": sorted(r for r, e in originals.items() if e is None)}


def op_retire(req):
    """(locked) The patch set's leftovers after sglang was reinstalled at another version:
    each file the state records that still has the recorded sha256 and that the installed
    sglang's RECORD does not list is removed; the backup (another version's originals) and
    the state are dropped. Files the new sglang owns are never touched."""
    v = Venv(req["package"], req["venv"])
    v.check_lock(req.get("lock"))
    pkg = v.recorded_package(req["package_dir"])
    owned = set()
    folder = dist_info(v.purelib, v.package)
    if folder is not None:
        prefix = v.package + "/"
        owned = {rel[len(prefix):] for rel in record(v.purelib, folder) if rel.startswith(prefix)}
    removed = []
    for rel, digest in req["files"].items():
        path, kind = v.target(rel)
        if kind == "file" and rel not in owned and entry_of(path, kind)["sha256"] == digest:
            os.unlink(path)
            removed.append(rel)
    clear_pycache(pkg, list(req["files"]))
    if req.get("backup"):
        with contextlib.suppress(Refused):
            shutil.rmtree(v.recorded_backup(req["backup"]))
    if os.path.lexists(v.state_path):
        os.unlink(v.state_path)
    v.clear_pending()
    return {"removed": sorted(removed)}


def recover(v):
    """Undo an install cut short (its note says which backup): every upstream file back,
    the state and the backup dropped. Returns what it says, or None."""
    note = v.pending()
    if note is None:
        return None
    if note.get("form") == "plugin":
        return undo_plugin(v, note)
    if note.get("form") != "patch":
        v.clear_pending()
        return "a note of an unknown install was dropped"
    bdir = v.recorded_backup(note.get("backup"))
    pkg = v.need_pkg()
    _, wrong = restore_all(v, pkg, bdir)
    if wrong:
        raise Refused(f"an install cut short left {', '.join(wrong)} that the backup in {bdir} "
                      "cannot restore")
    drop_backup(v, bdir)
    return (f"an install cut short was undone: the upstream files were put back from {bdir} "
            "and its state dropped")


def _known_rels(v, extra):
    rels = set(extra or [])
    for path in (v.state_path, v.pending_path):
        try:
            doc = json.loads(read_small(path, MAX_DOC, "the state").decode("utf-8"))
        except (OSError, ValueError, Refused):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("files"), dict):
            rels.update(r for r in doc["files"] if isinstance(r, str))
        bdir = doc.get("backup") if isinstance(doc, dict) else None
        with contextlib.suppress(OSError, ValueError, Refused):
            rels.update(backup_manifest(v.recorded_backup(bdir)))
    out = []
    for rel in rels:
        try:
            out.append(rel_ok(rel))
        except Refused:
            continue
    return sorted(out)


def op_hold(req):
    """Take the lock; answer; keep it until stdin ends (sys.stdin: the rest of the stream)."""
    v = Venv(req["package"], req["venv"])
    fd = v.take_lock()
    if fd is None:
        return {"busy": v.holder_text()}
    swept = sweep_temporaries(v.pkg, _known_rels(v, req.get("rels")), v.state_dir)
    recovered = recover(v) if v.pkg is not None else None
    answer({"locked": True, "token": str(os.getpid()), "swept": swept, "recovered": recovered})
    while sys.stdin.buffer.read(65536):
        pass
    os.close(fd)
    return None


OPS = {"locate": op_locate, "backup": op_backup, "read": op_read, "install": op_install,
       "restore": op_restore, "retire": op_retire, "hold": op_hold, **PLUGIN_OPS}


def answer(out):
    sys.stdout.write(json.dumps({"ddtree_payload": 1, "result": out}) + "\n")
    sys.stdout.flush()


def main(argv):
    try:
        line = sys.stdin.buffer.readline(MAX_REQUEST + 1)
        if len(line) > MAX_REQUEST:
            raise Refused(f"a request over {MAX_REQUEST} bytes")
        req = json.loads(line.decode("utf-8"))
        out = OPS[req["op"]](req)
    except Refused as exc:
        out = {"refused": str(exc)}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    if out is not None:
        answer(out)
    return 0
