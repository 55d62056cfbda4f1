"""The patch form's backup of the upstream originals (a part of remote/payload.py's bundle):
`.ddtree-deploy/backups/<name>/manifest.json` (rel -> the original's sha256 and symlink text,
or None for a file the payload added) and `files/<rel>` (each original, a symlink kept as one).
"""

import json
import os
import shutil
import stat

from ddtree_deploy.remote.payload_fs import (
    MAX_DOC,
    MAX_FILE,
    Refused,
    clear_pycache,
    link_atomic,
    read_small,
    real_inside,
    rel_ok,
    sha,
    write_atomic,
)


def entry_of(path, kind):
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


def write_manifest(bdir, originals):
    write_atomic(os.path.join(bdir, "manifest.json"),
                 json.dumps({"format": 2, "originals": originals}, indent=1).encode())


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


def save_original(v, bdir, rel, have, path, kind):
    dest = v.ensure_dir(bdir, ["files"] + rel.split("/")[:-1])
    dest = os.path.join(dest, os.path.basename(rel))
    if kind == "link":
        link_atomic(dest, have["link"])
    else:
        write_atomic(dest, read_small(os.path.realpath(path), MAX_FILE, "file"),
                     stat.S_IMODE(os.stat(path).st_mode) or 0o644)


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


def restore_all(v, pkg, bdir):
    """Every original back from the backup (all checked first: a refused restore touches
    nothing), what the payload added removed, __pycache__ cleared; then each file compared.
    Returns (originals, the rels that are still not the original)."""
    originals = backup_manifest(bdir)
    for rel, e in originals.items():
        v.target(rel)
        if e is not None:
            backup_file(bdir, rel, e)
    for rel, e in originals.items():
        restore_one(v, bdir, rel, e)
    clear_pycache(pkg, list(originals))
    wrong = []
    for rel, e in originals.items():
        path, kind = v.target(rel)
        have = entry_of(path, kind)
        if (have and (have["sha256"], have["link"])) != (e and (e["sha256"], e["link"])):
            wrong.append(rel)
    return originals, wrong


def drop_backup(v, bdir):
    if os.path.lexists(v.state_path):
        os.unlink(v.state_path)
    shutil.rmtree(bdir)
    v.clear_pending()
