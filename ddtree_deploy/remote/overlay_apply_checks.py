"""The target side of the overlay, part 2: the lane's checks after the swap.

torch's CUDA version (read from torch/version.py, not imported), the libcudart major
every placed shared object needs (DT_NEEDED, via remote/facts_elf.py), and imports of
listed modules, each in a subprocess of the venv's python with a timeout and no .pyc
written. Stdlib only, Python >= 3.8 syntax (bundled by remote/bundle.py).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from typing import Any

from ddtree_deploy.remote.facts_elf import ElfError, elf_dynamic
from ddtree_deploy.remote.overlay_apply_state import Site

_CUDART = re.compile(r"libcudart\.so\.(\d+)")
_SO = re.compile(r"\.so(\.\d+)*$")


def run_checks(site: Site, man: dict[str, Any], checks: dict[str, Any]) -> list[dict[str, Any]]:
    """The lane's checks; each {check, ok, detail}."""
    out: list[dict[str, Any]] = []
    want = checks.get("torch_cuda")
    if want is not None:
        got = torch_cuda(os.path.join(site.site, "torch", "version.py"))
        out.append({"check": "torch_cuda", "ok": got == want,
                    "detail": f"torch.version.cuda is {got!r}, expected {want!r}"})
    major = checks.get("extension_cudart_major")
    if major is not None:
        bad, seen = [], 0
        for rel, _sha in man["placed"]:
            if not _SO.search(rel):
                continue
            try:
                needed = elf_dynamic(site.abs(rel))["needed"]
            except ElfError:
                continue
            for lib in needed:
                match = _CUDART.fullmatch(lib)
                if match:
                    seen += 1
                    if int(match.group(1)) != int(major):
                        bad.append(f"{rel} needs {lib}")
        detail = f"{seen} shared objects need libcudart, all major {major}"
        out.append({"check": "extension_cudart_major", "ok": not bad,
                    "detail": "; ".join(bad[:10]) + (" ..." if len(bad) > 10 else "")
                    if bad else detail})
    python = os.path.join(site.venv, "bin", "python")
    python = python if os.path.exists(python) else sys.executable
    timeout = float(checks.get("timeout", 300))
    for module in checks.get("imports", []):
        argv = [python, "-B", "-c", "import importlib,sys; importlib.import_module(sys.argv[1])",
                module]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/",
                                  stdin=subprocess.DEVNULL)
            tail = (proc.stderr.strip().splitlines() or [""])[-1]
            out.append({"check": "import " + module, "ok": proc.returncode == 0,
                        "detail": "imports" if proc.returncode == 0 else
                        f"exit {proc.returncode}: {tail}"})
        except subprocess.TimeoutExpired:
            out.append({"check": "import " + module, "ok": False,
                        "detail": f"did not finish within {timeout:g}s"})
    return out


def torch_cuda(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(value, ast.Constant):
            return value.value if isinstance(value.value, str) else None
    return None

