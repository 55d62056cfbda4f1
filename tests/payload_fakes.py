"""A small venv with a fake sglang and a small payload for it, built in a tmp folder.

The venv is a real `python -m venv` (its python runs the payload tool's host-side script);
its sglang is three files and a dist-info, so tests do not depend on the registry's wheel or
on the shipped payload's file list.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import yaml

UPSTREAM = {
    "srt/speculative/spec_info.py": "class SpeculativeAlgorithm:\n    NONE = 0\n    DFLASH = 1\n",
    "srt/server_args.py": "FLAGS = ['--speculative-algorithm']\n",
    "srt/speculative/dflash_worker.py": "class DFlashWorker:\n    pass\n",
}
SPEC_PATCH = """--- a/srt/speculative/spec_info.py
+++ b/srt/speculative/spec_info.py
@@ -1,3 +1,4 @@
 class SpeculativeAlgorithm:
     NONE = 0
     DFLASH = 1
+    DDTREE = 2
"""
ARGS_PATCH = """--- a/srt/server_args.py
+++ b/srt/server_args.py
@@ -1 +1 @@
-FLAGS = ['--speculative-algorithm']
+FLAGS = ['--speculative-algorithm', '--speculative-ddtree-budget']
"""
VERIFY_OK = ("import os, sys\n"
             "text = open(os.path.join(sys.argv[1], 'srt/speculative/spec_info.py')).read()\n"
             "assert 'DDTREE' in text, 'DDTREE missing'\nprint('ddtree ok')\n")
VERIFY_FAIL = "import sys\nsys.exit('this check always fails')\n"


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


def fake_venv(root: Path, name: str = "venv", version: str = "0.5.11") -> Path:
    venv = root / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    sp = site_packages(venv)
    for rel, text in UPSTREAM.items():
        (sp / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
        (sp / "sglang" / rel).write_text(text)
    dist = sp / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return venv


def package(venv: Path) -> Path:
    return site_packages(venv) / "sglang"


def payload_folder(root: Path, *, version: str = "0.2.0", worker: str = "WORKER = 2\n",
                   extra_file: bool = True, args_patch: bool = True,
                   verify: str = VERIFY_OK, **overrides: object) -> Path:
    """A payload folder: patches spec_info (and server_args), adds ddtree_worker.py (and
    ddtree_extra.py); `overrides` replace top-level keys of the manifest as given."""
    folder = root / f"payload-{version}-{abs(hash((worker, extra_file, args_patch))) % 10**6}"
    (folder / "patches").mkdir(parents=True)
    (folder / "patches/spec_info.py.patch").write_text(SPEC_PATCH)
    (folder / "patches/server_args.py.patch").write_text(ARGS_PATCH)
    (folder / "files").mkdir()
    (folder / "files/ddtree_worker.py").write_text(worker)
    (folder / "files/ddtree_extra.py").write_text("EXTRA = 1\n")
    patches = [{"target": "srt/speculative/spec_info.py",
                "sha256": sha(UPSTREAM["srt/speculative/spec_info.py"]),
                "patch": "patches/spec_info.py.patch"}]
    if args_patch:
        patches.append({"target": "srt/server_args.py",
                        "sha256": sha(UPSTREAM["srt/server_args.py"]),
                        "patch": "patches/server_args.py.patch"})
    files = [{"source": "files/ddtree_worker.py", "target": "srt/speculative/ddtree_worker.py"}]
    if extra_file:
        files.append({"source": "files/ddtree_extra.py",
                      "target": "srt/speculative/ddtree_extra.py"})
    doc: dict[str, object] = {
        "payload": "ddtree", "version": version,
        "sglang": {"0.5.11": {"package": "sglang", "patches": patches, "files": files}},
        "verify": [{"name": "spec_info", "mode": "light", "code": verify}],
    }
    doc.update(overrides)
    (folder / "payload.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def tree(folder: Path) -> dict[str, str]:
    """Every entry below `folder` (no __pycache__): a file's sha256, a symlink's text."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if "__pycache__" in p.parts:
            continue
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "-> " + str(p.readlink())
        elif p.is_file():
            out[rel] = sha(p.read_bytes())
    return out
