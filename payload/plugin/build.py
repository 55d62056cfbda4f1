"""Build the DDTree plugin wheel (stdlib only; the same bytes every run).

    python3 payload/plugin/build.py --out DIR   # prints {"wheel": PATH, ...} as its last line

The wheel ``ddtree_sglang_plugin-VERSION-py3-none-any.whl`` holds:

* ``ddtree_sglang/``: this folder's package (the SGLang glue; VERSION is its ``__version__``);
* ``ddtree_sglang/verify.py``: the verify round of the 0.5.11 patch set
  (``payload/sglang-0.5.11/srt/speculative/ddtree_verify.py``), its one import of the core
  pointed at the ``ddtree`` package instead of SGLang's copy;
* ``ddtree/``: the shared DDTree core, ``payload/ddtree/*.py`` as they are;
* the entry point ``ddtree = ddtree_sglang.plugin:load`` in the group ``sglang.srt.plugins``.

Reproducible: entries sorted, fixed timestamps and modes, fixed compression level.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAYLOAD = HERE.parent
NAME, DIST = "ddtree-sglang-plugin", "ddtree_sglang_plugin"
ENTRY_GROUP, ENTRY = "sglang.srt.plugins", "ddtree = ddtree_sglang.plugin:load"
VERIFY_SOURCE = PAYLOAD / "sglang-0.5.11" / "srt" / "speculative" / "ddtree_verify.py"
CORE_IMPORT = "from sglang.srt.speculative.ddtree_core import"
EPOCH = (1980, 1, 1, 0, 0, 0)


class BuildError(Exception):
    pass


def version() -> str:
    text = (HERE / "ddtree_sglang" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([0-9][0-9A-Za-z.+-]*)"$', text, re.M)
    if found is None:
        raise BuildError("ddtree_sglang/__init__.py: no __version__ = \"X.Y.Z\" line")
    return found.group(1)


def _verify_module() -> bytes:
    text = VERIFY_SOURCE.read_text(encoding="utf-8")
    if text.count(CORE_IMPORT) != 1 or "sglang" in text.replace(CORE_IMPORT, ""):
        raise BuildError(f"{VERIFY_SOURCE}: expected exactly one sglang import ({CORE_IMPORT})")
    return text.replace(CORE_IMPORT, "from ddtree.core import").encode()


def members() -> dict[str, bytes]:
    """Archive name -> bytes of every file of the wheel but its RECORD."""
    files: dict[str, bytes] = {}
    for path in sorted((HERE / "ddtree_sglang").glob("*.py")):
        files[f"ddtree_sglang/{path.name}"] = path.read_bytes()
    if "ddtree_sglang/verify.py" in files:
        raise BuildError("ddtree_sglang/verify.py is generated; remove the source copy")
    files["ddtree_sglang/verify.py"] = _verify_module()
    for path in sorted((PAYLOAD / "ddtree").glob("*.py")):
        files[f"ddtree/{path.name}"] = path.read_bytes()
    ver = version()
    info = f"{DIST}-{ver}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {ver}\n"
        "Summary: DDTree speculative decoding for SGLang 0.5.17+ as a plugin "
        "(SpeculativeAlgorithm.register)\nRequires-Python: >=3.10\n").encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: ddtree-deploy payload/plugin/build.py\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{info}/entry_points.txt"] = f"[{ENTRY_GROUP}]\n{ENTRY}\n".encode()
    files[f"{info}/top_level.txt"] = b"ddtree\nddtree_sglang\n"
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(out_dir: Path) -> Path:
    """Write the wheel into ``out_dir`` (created) and return its path."""
    files = members()
    ver = version()
    record = f"{DIST}-{ver}.dist-info/RECORD"
    lines = [_record_line(n, files[n]) for n in sorted(files)] + [f"{record},,"]
    files[record] = ("\n".join(lines) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{DIST}-{ver}-py3-none-any.whl"
    # A temporary name of this build's own: two processes building into the same cache folder
    # at once must not write (or rename away) each other's half-written file.
    fd, part = tempfile.mkstemp(dir=out_dir, prefix=f".{target.name}.", suffix=".part")
    temp = Path(part)
    try:
        with os.fdopen(fd, "wb") as fh, zipfile.ZipFile(fh, "w") as archive:
            for name in sorted(files, key=lambda n: (n.endswith("/RECORD"), n)):
                entry = zipfile.ZipInfo(name, date_time=EPOCH)
                entry.external_attr = 0o644 << 16
                entry.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(entry, files[name], compresslevel=9)
        temp.chmod(0o644)
        temp.replace(target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the wheel")
    args = parser.parse_args(argv)
    try:
        wheel = build_wheel(args.out)
    except (BuildError, OSError) as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    print(json.dumps({"wheel": str(wheel), "name": NAME, "version": version(), "sha256": digest}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
