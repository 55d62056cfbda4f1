"""The probe's view of one virtual environment: dists, torch, compiled extensions, nvidia layout.

Reads files only (never imports torch, sglang, flashinfer or xgrammar). The sglang part lives
in probe_sglang. Part of the probe bundle (facts/bundle.py): stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import glob
import os
import re
import time
from typing import Any

from ddtree_deploy.facts.probe_elf import ElfError, elf_dynamic
from ddtree_deploy.facts.probe_parse import (
    canonical_name,
    cuda_major_of,
    is_cuda_lib,
    parse_metadata,
    parse_record_paths,
    parse_torch_version_py,
)

EXT_SCAN_BUDGET_S = 20.0  # stop walking a venv's shared objects after this long
EXT_SKIP_TOP = ("nvidia",)  # the CUDA libraries themselves: reported by the layout part
_SO_RE = re.compile(r"\.so(\.\d+)*$")
CU12_COMPONENTS = (
    "cublas", "cuda_cupti", "cuda_nvcc", "cuda_nvrtc", "cuda_runtime", "cufft", "cufile",
    "curand", "cusolver", "cusparse", "nvjitlink", "nvtx",
)  # fmt: skip


def read_text(path: str, limit: int = 4 << 20) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read(limit)


def venv_python_version(venv: str, site_packages: str | None) -> str | None:
    """From pyvenv.cfg (version_info / version), else the site-packages folder's pythonX.Y."""
    cfg = os.path.join(venv, "pyvenv.cfg")
    if os.path.isfile(cfg):
        keys: dict[str, str] = {}
        for line in read_text(cfg).splitlines():
            key, eq, value = line.partition("=")
            if eq:
                keys[key.strip().lower()] = value.strip()
        for key in ("version_info", "version"):
            if keys.get(key):
                return keys[key]
    if site_packages:
        found = re.search(r"python(\d+\.\d+)", site_packages)
        if found:
            return found.group(1)
    return None


def find_site_packages(venv: str) -> str | None:
    """<venv>/lib/pythonX.Y/site-packages (lib64 as fallback); the fullest when several."""
    found = []
    for lib in ("lib", "lib64"):
        found += sorted(glob.glob(os.path.join(venv, lib, "python3*", "site-packages")))
    found = [p for p in found if os.path.isdir(p)]
    if not found:
        return None
    return max(found, key=lambda p: len(os.listdir(p)))


def scan_distributions(sp: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """({canonical name: version}, {relative .so path: owner}, problems) from *.dist-info."""
    dists: dict[str, str] = {}
    owners: dict[str, str] = {}
    problems: list[str] = []
    for entry in sorted(os.listdir(sp)):
        if entry.endswith(".dist-info"):
            meta_file = os.path.join(sp, entry, "METADATA")
        elif entry.endswith(".egg-info"):
            meta_file = os.path.join(sp, entry, "PKG-INFO")
            if not os.path.isfile(meta_file):
                meta_file = os.path.join(sp, entry)  # a flat egg-info file
        else:
            continue
        try:
            meta = parse_metadata(read_text(meta_file, 64 << 10))
        except OSError as exc:
            problems.append(f"{entry}: {exc.strerror or exc}")
            continue
        if not meta["name"] or not meta["version"]:
            problems.append(f"{entry}: METADATA without Name or Version")
            continue
        name = canonical_name(meta["name"])
        dists.setdefault(name, meta["version"])
        record = os.path.join(sp, entry, "RECORD")
        if not os.path.isfile(record):
            continue
        try:
            lines = [ln for ln in read_text(record, 64 << 20).splitlines() if ".so" in ln]
        except OSError:
            continue
        for rel in parse_record_paths("\n".join(lines)):
            if _SO_RE.search(rel):
                owners.setdefault(os.path.normpath(rel), name)
    return dists, owners, problems


def torch_info(sp: str, dists: dict[str, str]) -> dict[str, Any] | None:
    """torch's version with its local tag and CUDA version from torch/version.py (not run)."""
    version_py = os.path.join(sp, "torch", "version.py")
    if "torch" not in dists and not os.path.isdir(os.path.join(sp, "torch")):
        return None
    info: dict[str, Any] = {"version": None, "cuda": None, "dist_version": dists.get("torch")}
    if os.path.isfile(version_py):
        info.update(parse_torch_version_py(read_text(version_py)))
    return info


def extension_entry(sp: str, rel: str, owner: str | None) -> dict[str, Any] | None:
    """One shared object's CUDA needs; None when it needs no CUDA library."""
    entry: dict[str, Any] = {"path": rel, "distribution": owner}
    try:
        dyn = elf_dynamic(os.path.join(sp, rel))
    except ElfError as exc:
        entry["error"] = str(exc)
        return entry
    needed = [n for n in dyn["needed"] if is_cuda_lib(n)]
    if not needed:
        return None
    majors = {cuda_major_of(n) for n in needed}
    entry["needed"] = needed
    entry["cuda_majors"] = sorted(m for m in majors if m is not None)
    entry["rpath"] = dyn["runpath"] or dyn["rpath"]
    return entry


def scan_extensions(
    sp: str, owners: dict[str, str], budget_s: float = EXT_SCAN_BUDGET_S
) -> tuple[list[dict[str, Any]], str | None]:
    """Every shared object under site-packages (except nvidia/) that needs a CUDA library,
    or that could not be read. Returns (entries, error when the time budget ran out)."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + budget_s
    for root, dirs, files in os.walk(sp):
        rel_root = os.path.relpath(root, sp)
        if rel_root == ".":
            dirs[:] = [d for d in dirs if d not in EXT_SKIP_TOP and not d.endswith(".dist-info")]
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not _SO_RE.search(name):
                continue
            full = os.path.join(root, name)
            if os.path.islink(full):
                continue
            rel = os.path.normpath(os.path.join(rel_root, name))
            entry = extension_entry(sp, rel, owners.get(rel))
            if entry is not None:
                out.append(entry)
            if time.monotonic() > deadline:
                return out, f"extension scan stopped after {budget_s:.0f}s (partial list)"
    return out, None


def nvidia_layout(sp: str) -> dict[str, Any]:
    """Which nvidia/*/lib folders exist: CUDA 12's per-component ones, CUDA 13's cu13, others."""
    layout: dict[str, Any] = {"cu12_components": [], "cu13": False, "other": [], "lib_dirs": []}
    base = os.path.join(sp, "nvidia")
    if not os.path.isdir(base):
        return layout
    for comp in sorted(os.listdir(base)):
        lib = os.path.join(base, comp, "lib")
        if not os.path.isdir(lib):
            continue
        layout["lib_dirs"].append(lib)
        if comp == "cu13":
            layout["cu13"] = True
        elif comp in CU12_COMPONENTS or any(".so.12" in f for f in os.listdir(lib)):
            layout["cu12_components"].append(comp)
        else:
            layout["other"].append(comp)
    return layout


def find_package_dir(sp: str, package: str) -> str | None:
    """A top-level package's folder: in site-packages, or where an editable install points
    (a setuptools __editable__ finder's mapping, or a plain path in a .pth file)."""
    direct = os.path.join(sp, package)
    if os.path.isdir(direct):
        return direct
    mapping = re.compile("['\"]" + re.escape(package) + "['\"]\\s*:\\s*['\"]([^'\"]+)['\"]")
    for finder in sorted(glob.glob(os.path.join(sp, "__editable__*finder.py"))):
        found = mapping.search(read_text(finder, 1 << 20))
        if found and os.path.isdir(found.group(1)):
            return found.group(1)
    for pth in sorted(glob.glob(os.path.join(sp, "*.pth"))):
        for line in read_text(pth, 1 << 16).splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "import")):
                candidate = os.path.join(line, package)
                if os.path.isdir(candidate):
                    return candidate
    return None
