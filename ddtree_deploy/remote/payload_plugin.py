"""The plugin form on the host (a part of remote/payload.py's bundle): SGLang 0.5.17+ loads the
DDTree plugin itself through the `sglang.srt.plugins` entry-point group; the workstation installs
its wheel with uv (or the venv's own pip, `--no-index --no-deps`) and these ops read and record
what that left, so nothing here writes into site-packages: the installer does, and only the
plugin's own distribution.

  plugin_stage  -- (locked) the path in the state folder where the wheel is put;
  plugin_facts  -- (in locate) the plugin distribution's version, the entry points of the group
                   (every distribution's), its files with their sha256 now and in its RECORD;
  plugin_record -- (locked) check the installed distribution is the one asked for, then write
                   the state (form "plugin", each file's sha256); nothing else is written;
  plugin_forget -- (locked) drop the state once the distribution is gone;
  sglang_intact -- every file of a distribution's RECORD compared with the hash there.
"""

import base64
import csv
import io
import json
import os

from ddtree_deploy.remote.payload_fs import (
    MAX_DOC,
    MAX_FILE,
    NAME,
    Refused,
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
    write_atomic(v.state_path, json.dumps(state, indent=1).encode())
    return {"files": len(files)}


def op_plugin_stage(req):
    """(locked) Where the workstation puts the wheel: in the venv's state folder."""
    v = Venv("sglang", req["venv"])
    v.check_lock(req.get("lock"))
    name = req.get("name")
    if not isinstance(name, str) or not NAME.match(name) or not name.endswith(".whl"):
        raise Refused(f"{name!r} is not a wheel file name")
    return {"path": os.path.join(v.ensure_state_dir(), name)}


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
              "plugin_forget": op_plugin_forget, "sglang_intact": op_sglang_intact}
