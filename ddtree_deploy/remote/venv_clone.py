"""Clone a venv on its host: `python3 - SRC DST` (this file on stdin), run as root.

The copy keeps symlinks (bin/python stays a link to the base interpreter); every text script in
DST/bin whose first line names SRC's interpreter (and the activate scripts) is pointed at DST's,
pyvenv.cfg's `command` line is updated, and the clone's python is run once. The copy is made
under a temporary name and renamed into place. Prints {"fixed": [...], "prefix", "rc",
"stderr"}, or {"error": why} with exit 3 (SRC no venv, DST already there).
Sent as it is (not bundled): Python >= 3.8 syntax, stdlib only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

REFUSED = 3


def main(argv: list[str]) -> int:
    src, dst = os.path.normpath(argv[0]), os.path.normpath(argv[1])
    if not os.path.isfile(os.path.join(src, "pyvenv.cfg")):
        print(json.dumps({"error": src + " is not a venv (no pyvenv.cfg)"}))
        return REFUSED
    if os.path.lexists(dst):
        print(json.dumps({"error": dst + " already exists"}))
        return REFUSED
    tmp = dst + ".ddtree-clone-partial"
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp, symlinks=True)
    fixed = []
    old = src.encode() + b"/bin/"
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
    out = subprocess.run([os.path.join(dst, "bin", "python"), "-c",
                          "import sys; print(sys.prefix)"],
                         capture_output=True, text=True, timeout=60)
    print(json.dumps({"fixed": fixed, "prefix": out.stdout.strip(), "rc": out.returncode,
                      "stderr": out.stderr[-500:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
