"""The plugin form on the host (a part of remote/payload.py's bundle): SGLang 0.5.17+ loads the
DDTree plugin itself through the `sglang.srt.plugins` entry-point group; the workstation installs
its wheel with uv (or the venv's own pip, `--no-index --no-deps`) and these ops read and record
what that left, so nothing here writes into site-packages: the installer does, and only the
plugin's own distribution.

  plugin_stage  -- (locked) the path in the state folder where the wheel is put, and a note
                   (pending.json, form "plugin") of what the install may add: the wheel's paths
                   absent now and the staged wheel;
  plugin_undo   -- (locked) an install that failed undone from that note: what it added
                   removed (the folders it created whole), the staged wheel too; the lock's
                   `hold` does the same for an install cut short by a kill (undo_plugin);
                   one that finished (its new .dist-info's RECORD whole) is kept;
  plugin_facts  -- (in locate) the plugin distribution's version, the entry points of the group
                   (every distribution's), its files with their sha256 now and in its RECORD;
  plugin_record -- (locked) check the installed distribution is the one asked for, drop the
                   note, then write the state (form "plugin", each file's sha256);
  plugin_forget -- (locked) drop the state once the distribution is gone;
  sglang_intact -- every file of a distribution's RECORD compared with the hash there.
"""

import base64
import csv
import io
import json
import os
import shutil

from ddtree_deploy.remote.payload_fs import (
    MAX_DOC,
    MAX_FILE,
    NAME,
    Refused,
    clear_pycache,
    inside,
    read_small,
    rel_ok,
    sha,
    write_atomic,
)
from ddtree_deploy.remote.payload_venv import Venv

GROUP = "sglang.srt.plugins"


def _canon(name):
    return name.replace("-", "_").replace(".", "_").lower()


def dist_info(purelib, dist):
    """The .dist-info folder of distribution `dist` in purelib, or None."""
    want = _canon(dist)
    for entry in sorted(os.listdir(purelib)):
        if entry.endswith(".dist-info") and _canon(entry[:-10].rsplit("-", 1)[0]) == want:
            return os.path.join(purelib, entry)
    return None


def _meta(folder, name):
    try:
        return read_small(os.path.join(folder, name), MAX_DOC, name).decode("utf-8", "replace")
    except (OSError, Refused):
        return ""


def _version(folder):
    for line in _meta(folder, "METADATA").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None


def entry_points(purelib, group=GROUP):
    """Every `group` entry point of the venv's distributions: [{dist, name, value}]."""
    out = []
    for entry in sorted(os.listdir(purelib)):
        if not entry.endswith(".dist-info"):
            continue
        section = None
        for line in _meta(os.path.join(purelib, entry), "entry_points.txt").splitlines():
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
            elif section == group and "=" in line:
                name, value = line.split("=", 1)
                out.append({"dist": entry[:-10].rsplit("-", 1)[0], "name": name.strip(),
                            "value": value.strip()})
    return out


def record(purelib, folder):
    """rel (inside purelib) -> (the RECORD's sha256 or None, the file's sha256 now or None)."""
    out = {}
    text = _meta(folder, "RECORD")
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        try:
            rel = rel_ok(row[0])
        except Refused:
            continue  # outside purelib (scripts, data) or odd: not the package's files
        want = None
        if len(row) > 1 and row[1].startswith("sha256="):
            raw = row[1][7:]
            want = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
        path = os.path.join(purelib, rel)
        have = None
        if os.path.isfile(path) and not os.path.islink(path):
            try:
                have = sha(read_small(path, MAX_FILE, "file"))
            except Refused:
                have = None
        out[rel] = (want, have)
    return out


def plugin_facts(v, req):
    if not isinstance(req, dict) or not isinstance(req.get("dist"), str):
        return None
    folder = dist_info(v.purelib, req["dist"])
    out = {"dist": req["dist"], "version": None, "entry_points": entry_points(v.purelib),
           "files": {}}
    if folder is not None:
        out["version"] = _version(folder)
        out["files"] = {rel: have for rel, (_want, have) in record(v.purelib, folder).items()
                        if not rel.endswith(".pyc")}
    return out


def op_plugin_record(req):
    v = Venv("sglang", req["venv"])
    v.check_lock(req.get("lock"))
    state = req["state"]
    folder = dist_info(v.purelib, req["dist"])
    if folder is None or _version(folder) != req["dist_version"]:
        raise Refused(f"{req['dist']} {req['dist_version']} is not installed in {v.prefix}")
    files = {}
    for rel, (want, have) in record(v.purelib, folder).items():
        if want is None:
            continue
        if have != want:
            raise Refused(f"{rel} of {req['dist']} is not the file its RECORD lists")
        files[rel] = have
    state.update({"package_dir": v.purelib, "files": files, "backup": None})
    v.ensure_state_dir()
    v.clear_pending()  # the install is whole: a kill from here on leaves it, never undoes it
    write_atomic(v.state_path, json.dumps(state, indent=1).encode())
    return {"files": len(files)}


def _absent(purelib, rels):
    """Of the wheel's paths `rels`: the files absent now, and the top-most absent folder above
    each (what an install would create whole)."""
    files, dirs = set(), set()
    for rel in rels:
        if not isinstance(rel, str):
            continue
        try:
            rel = rel_ok(rel)
        except Refused:
            continue
        if os.path.lexists(os.path.join(purelib, rel)):
            continue
        parts = rel.split("/")
        top = next((i for i in range(1, len(parts))
                    if not os.path.lexists(os.path.join(purelib, *parts[:i]))), None)
        if top is None:
            files.add(rel)
        else:
            dirs.add("/".join(parts[:top]))
    return sorted(files), sorted(dirs)


def op_plugin_stage(req):
    """(locked) Where the workstation puts the wheel: in the venv's state folder; the note of
    what the install may add is written first."""
    v = Venv("sglang", req["venv"])
    v.check_lock(req.get("lock"))
    name = req.get("name")
    if not isinstance(name, str) or not NAME.match(name) or not name.endswith(".whl"):
        raise Refused(f"{name!r} is not a wheel file name")
    rels = req.get("adds") or []
    if not isinstance(rels, list):
        raise Refused("adds is not a list")
    files, dirs = _absent(v.purelib, rels)
    state_dir = v.ensure_state_dir()
    v.note_pending({"form": "plugin", "files": {}, "adds": files, "dirs": dirs, "staged": name})
    return {"path": os.path.join(state_dir, name)}


def _finished(purelib, dirs):
    """The .dist-info among the noted new folders whose RECORD is whole (pip and uv write it
    last): every file it lists has the sha256 listed. An install that got so far is whole."""
    for rel in dirs:
        if rel.endswith(".dist-info") and "/" not in rel:
            rows = record(purelib, os.path.join(purelib, rel))
            if any(want for want, _ in rows.values()) and \
                    all(want is None or want == have for want, have in rows.values()):
                return rel
    return None


def _drop_staged(v, note):
    staged = note.get("staged")
    if isinstance(staged, str) and NAME.match(staged) and staged.endswith(".whl"):
        path = os.path.join(v.state_dir, staged)
        if os.path.isfile(path) and not os.path.islink(path):
            os.unlink(path)


def _check_note(v, note):
    """The note's shape as plugin_stage writes it, else refused naming it (never a TypeError
    that leaves the venv stuck with no file named)."""
    wrong = [key for key in ("dirs", "adds") if not isinstance(note.get(key, []), list)
             or not all(isinstance(rel, str) for rel in note.get(key, []))]
    if not isinstance(note.get("staged"), str):
        wrong.append("staged")
    if wrong:
        raise Refused(f"{v.pending_path} is not a plugin install's note as this tool writes it "
                      f"({', '.join(wrong)}: expected a list of paths, staged a wheel's name): "
                      "check by hand that the folders and files it lists are whole, then "
                      "delete it to release the venv")


def undo_plugin(v, note):
    """Remove what an install of the plugin added (its note: files and folders that were absent
    before it) and the staged wheel, then drop the note. Returns what it says. An install that
    finished (its new .dist-info's RECORD whole) is kept: undoing an upgrade from the note would
    leave the package's files with no .dist-info owning them (pip removed the old one)."""
    _check_note(v, note)
    purelib = os.path.realpath(v.purelib)
    done = _finished(purelib, note.get("dirs") or [])
    if done is not None:
        _drop_staged(v, note)
        v.clear_pending()
        return (f"an install of the plugin cut short had finished ({done} is whole): kept, "
                "but not recorded; `payload deploy` records it")
    removed = 0
    for rel in note.get("dirs") or []:
        try:
            path = os.path.join(purelib, rel_ok(rel))
        except Refused:
            continue
        if os.path.isdir(path) and not os.path.islink(path) \
                and inside(os.path.realpath(path), purelib):
            shutil.rmtree(path)
            removed += 1
    files = []
    for rel in note.get("adds") or []:
        try:
            path = os.path.join(purelib, rel_ok(rel))
        except Refused:
            continue
        if not inside(os.path.realpath(os.path.dirname(path)), purelib):
            continue
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
            files.append(rel)
            removed += 1
    clear_pycache(purelib, files)
    _drop_staged(v, note)
    v.clear_pending()
    return (f"an install of the plugin cut short was undone: {removed} file(s) or folder(s) "
            "it added removed")


def op_plugin_undo(req):
    """(locked) Undo an install of the plugin that failed (see undo_plugin)."""
    v = Venv("sglang", req["venv"])
    v.check_lock(req.get("lock"))
    note = v.pending()
    if note is None or note.get("form") != "plugin":
        return {"undone": None}
    return {"undone": undo_plugin(v, note)}


def op_plugin_forget(req):
    v = Venv("sglang", req["venv"])
    v.check_lock(req.get("lock"))
    if dist_info(v.purelib, req["dist"]) is not None:
        raise Refused(f"{req['dist']} is still installed in {v.prefix}")
    if os.path.lexists(v.state_path):
        os.unlink(v.state_path)
    return {"forgotten": True}


def op_sglang_intact(req):
    """Whether every file of a distribution's RECORD still has the hash listed there."""
    v = Venv("sglang", req["venv"])
    dist = req.get("dist", "sglang")
    if not isinstance(dist, str) or not NAME.match(dist):
        raise Refused(f"{dist!r} is not a distribution name")
    folder = dist_info(v.purelib, dist)
    if folder is None:
        raise Refused(f"{dist} is not installed in {v.prefix}")
    rows = record(v.purelib, folder)
    changed = sorted(rel for rel, (want, have) in rows.items()
                     if want is not None and want != have)
    return {"checked": sum(1 for w, _ in rows.values() if w is not None),
            "changed": changed[:50], "changed_count": len(changed)}


PLUGIN_OPS = {"plugin_stage": op_plugin_stage, "plugin_record": op_plugin_record,
              "plugin_undo": op_plugin_undo,
              "plugin_forget": op_plugin_forget, "sglang_intact": op_sglang_intact}
