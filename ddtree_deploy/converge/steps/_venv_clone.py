"""`venv clone HOST SRC DST`: the copy of a venv the story made by hand, done right.

The copy keeps symlinks (bin/python stays a link to the base interpreter), then
every text script in DST/bin whose first line names SRC's interpreter is pointed
at DST's, pyvenv.cfg's `command` line is updated, and the clone's python is run
once to prove it starts and sees its own prefix. DST must not exist. One round
trip: a stdlib script run by the host's python3.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ddtree_deploy.errors import RefusedError, RemoteCommandError
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport

CLONE = r"""
import json, os, shutil, subprocess, sys
src, dst = os.path.normpath(sys.argv[1]), os.path.normpath(sys.argv[2])
if not os.path.isfile(os.path.join(src, "pyvenv.cfg")):
    print(json.dumps({"error": src + " is not a venv (no pyvenv.cfg)"})); sys.exit(3)
if os.path.lexists(dst):
    print(json.dumps({"error": dst + " already exists"})); sys.exit(3)
tmp = dst + ".ddtree-clone-partial"
if os.path.lexists(tmp):
    shutil.rmtree(tmp)
shutil.copytree(src, tmp, symlinks=True)
fixed = []
old, new = src.encode() + b"/bin/", dst.encode() + b"/bin/"
bindir = os.path.join(tmp, "bin")
for name in sorted(os.listdir(bindir)):
    path = os.path.join(bindir, name)
    if os.path.islink(path) or not os.path.isfile(path):
        continue
    with open(path, "rb") as fh:
        data = fh.read()
    if data.startswith(b"#!") and old in data.split(b"\n", 1)[0] or (
            name.startswith("activate") and src.encode() in data):
        data = data.replace(src.encode(), dst.encode())
        with open(path, "wb") as fh:
            fh.write(data)
        fixed.append(name)
cfg = os.path.join(tmp, "pyvenv.cfg")
with open(cfg, encoding="utf-8") as fh:
    lines = [ln.replace(src, dst) if ln.startswith("command") else ln for ln in fh]
with open(cfg, "w", encoding="utf-8") as fh:
    fh.writelines(lines)
os.rename(tmp, dst)
out = subprocess.run([os.path.join(dst, "bin", "python"), "-c", "import sys; print(sys.prefix)"],
                     capture_output=True, text=True, timeout=60)
print(json.dumps({"fixed": fixed, "prefix": out.stdout.strip(), "rc": out.returncode,
                  "stderr": out.stderr[-500:]}))
"""


@dataclass(frozen=True)
class Cloned:
    src: str
    dst: str
    fixed_scripts: list[str]


def clone(t: ExecTransport, src: str, dst: str) -> Cloned:
    r = t.run(Command(argv=("python3", "-", src, dst), stdin=CLONE.encode(), sudo=True),
              timeout=1800)
    try:
        data = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteCommandError(f"{t.host}: venv clone failed: {r.stderr.strip()[-400:]}"
                                 ) from None
    if "error" in data:
        raise RefusedError(f"{t.host}: {data['error']}")
    if data["rc"] != 0 or data["prefix"].rstrip("/") != dst.rstrip("/"):
        raise RemoteCommandError(f"{t.host}: the clone's python does not start as {dst}: "
                                 f"{data['stderr'] or data['prefix']}")
    return Cloned(src, dst, data["fixed"])
