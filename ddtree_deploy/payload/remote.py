"""Small stdlib scripts the payload tool runs on the host, with the venv's own python.

LOCATE prints JSON: the package folder, the installed version (from dist-info),
the sha256 of each named file (None when absent), whether torch is installed, and
the payload state file's content. One round trip.
"""

from __future__ import annotations

STATE_DIR = ".ddtree-deploy"  # inside the venv: payload.json and backups/

LOCATE = r"""
import hashlib, json, os, sys, sysconfig, importlib.util
package, state_dir, rels = sys.argv[1], sys.argv[2], sys.argv[3:]
purelib = sysconfig.get_paths()["purelib"]
out = {"purelib": purelib, "package_dir": None, "version": None, "files": {}, "torch": False,
       "state": None}
pkg = os.path.join(purelib, package)
if os.path.isdir(pkg):
    out["package_dir"] = pkg
want = package.replace("-", "_").lower()
for entry in os.listdir(purelib):
    if entry.endswith(".dist-info") and entry.split("-")[0].lower() == want:
        with open(os.path.join(purelib, entry, "METADATA"), encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("Version:"):
                    out["version"] = line.split(":", 1)[1].strip()
                    break
for rel in rels:
    path = os.path.join(pkg, rel)
    try:
        with open(path, "rb") as fh:
            out["files"][rel] = hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        out["files"][rel] = None
out["torch"] = importlib.util.find_spec("torch") is not None
state = os.path.join(sys.prefix, state_dir, "payload.json")
if os.path.isfile(state):
    with open(state, encoding="utf-8") as fh:
        out["state"] = json.load(fh)
print(json.dumps(out))
"""

CLEAR_PYCACHE = r"""
import os, sys
pkg = sys.argv[1]
removed = 0
for rel in sys.argv[2:]:
    if not rel.endswith(".py"):
        continue
    folder = os.path.join(pkg, os.path.dirname(rel), "__pycache__")
    stem = os.path.basename(rel)[:-3] + "."
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            if name.startswith(stem) and name.endswith(".pyc"):
                os.unlink(os.path.join(folder, name))
                removed += 1
print(removed)
"""
