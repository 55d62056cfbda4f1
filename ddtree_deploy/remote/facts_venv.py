"""The probe's view of one virtual environment: dists, torch, compiled extensions, nvidia layout.

Reads files only (never imports torch, sglang, flashinfer or xgrammar). The sglang part lives
in facts_sglang. Part of the probe bundle (remote/bundle.py): stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import glob
import os
import re
import time
from collections.abc import Callable
from typing import Any

from ddtree_deploy.remote.facts_elf import ElfError, elf_dynamic, open_regular
from ddtree_deploy.remote.facts_memo import Memo
from ddtree_deploy.remote.facts_parse import (
    canonical_name,
    cuda_major_of,
    is_cuda_lib,
    parse_metadata,
    parse_record_paths,
    parse_torch_version_py,
)

EXT_SCAN_BUDGET_S = 20.0  # stop walking a venv's shared objects after this long
EXT_SKIP_TOP = ("nvidia",)  # the CUDA libraries themselves: reported by the layout part
RACY_S = 2.0  # a folder changed this recently may change again unseen in the same clock tick
_SO_RE = re.compile(r"\.so(\.\d+)*$")
CU12_COMPONENTS = (
    "cublas", "cuda_cupti", "cuda_nvcc", "cuda_nvrtc", "cuda_runtime", "cufft", "cufile",
    "curand", "cusolver", "cusparse", "nvjitlink", "nvtx",
)  # fmt: skip


def read_text(path: str, limit: int = 4 << 20) -> str:
    """At most `limit` bytes of a regular file as text; OSError for anything else (a FIFO
    planted as a METADATA or .pth would hold the probe until it is killed)."""
    with open_regular(path) as fh:
        return fh.read(limit).decode("utf-8", "replace")


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


def scan_distributions(
    sp: str, memo: Memo | None = None
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """({canonical name: version}, {relative .so path: owner}, problems) from *.dist-info."""
    memo = memo or Memo()
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
        record = os.path.join(sp, entry, "RECORD")
        one = memo.derive("dist", meta_file, [meta_file, record],
                          _distribution, entry, meta_file, record)
        if one.get("problem"):
            problems.append(one["problem"])
            continue
        dists.setdefault(one["name"], one["version"])
        for rel in one["so_files"]:
            owners.setdefault(rel, one["name"])
    return dists, owners, problems


def _distribution(entry: str, meta_file: str, record: str) -> dict[str, Any]:
    """One dist-info's name, version and the shared objects its RECORD lists."""
    try:
        meta = parse_metadata(read_text(meta_file, 64 << 10))
    except OSError as exc:
        return {"problem": f"{entry}: {exc.strerror or exc}"}
    if not meta["name"] or not meta["version"]:
        return {"problem": f"{entry}: METADATA without Name or Version"}
    out: dict[str, Any] = {"name": canonical_name(meta["name"]), "version": meta["version"],
                           "so_files": []}  # fmt: skip
    try:
        lines = [ln for ln in read_text(record, 64 << 20).splitlines() if ".so" in ln]
    except OSError:
        return out
    out["so_files"] = [os.path.normpath(rel) for rel in parse_record_paths("\n".join(lines))
                       if _SO_RE.search(rel)]  # fmt: skip
    return out


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
    sp: str, owners: dict[str, str], budget_s: float = EXT_SCAN_BUDGET_S, memo: Memo | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """Every shared object under site-packages (except nvidia/) that needs a CUDA library,
    or that could not be read. Returns (entries, error when the time budget ran out)."""
    memo = memo or Memo()
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + budget_s
    found, complete = shared_objects(sp, deadline, memo)
    if not complete:
        return out, f"extension scan stopped after {budget_s:.0f}s (partial list)"
    for rel in found:
        full = os.path.join(sp, rel)
        entry = memo.derive("elf", full, [full], extension_entry, sp, rel, None)
        if entry is not None:
            out.append(dict(entry, distribution=owners.get(rel)))
        if time.monotonic() > deadline:
            return out, f"extension scan stopped after {budget_s:.0f}s (partial list)"
    return out, None


def shared_objects(sp: str, deadline: float | None = None,
                   memo: Memo | None = None) -> tuple[list[str], bool]:
    """Relative paths of the shared objects under site-packages, sorted: not symlinks, not in
    __pycache__, the top-level nvidia/ and *.dist-info left out; and whether the walk finished
    before `deadline` (monotonic). With a memo, a finished walk is reused while none of the
    folders it listed has changed (a folder's mtime and ctime move when an entry is added,
    removed or renamed in it): one stat per folder instead of reading each folder again. A walk
    that listed a folder changed in the last RACY_S seconds is not kept: a change in the same
    clock tick as the listing could leave the folder's times as they were."""
    if memo is None:
        return _walk(sp, deadline, lambda _path: None)
    racy: list[bool] = []

    def walk(track: Callable[[str], Any]) -> list[Any]:
        since = time.time_ns() - int(RACY_S * 1e9)

        def sign(path: str) -> None:
            sig = track(path)
            if sig is not None and max(sig[1], sig[2]) >= since:
                racy.append(True)

        return list(_walk(sp, deadline, sign))

    found, complete = memo.derive_tracked("walk", sp, walk,
                                          keep=lambda value: bool(value[1]) and not racy)
    return list(found), bool(complete)


def _walk(sp: str, deadline: float | None,
          track: Callable[[str], None]) -> tuple[list[str], bool]:
    found: list[str] = []
    stack: list[tuple[str, str]] = [("", sp)]
    while stack:
        if deadline is not None and time.monotonic() > deadline:
            return sorted(found), False
        rel, path = stack.pop()
        track(path)
        try:
            with os.scandir(path) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        if e.name == "__pycache__" or (not rel and (
                                e.name in EXT_SKIP_TOP or e.name.endswith(".dist-info"))):
                            continue
                        stack.append((rel + e.name + "/", e.path))
                    elif _SO_RE.search(e.name) and not e.is_symlink():
                        found.append(rel + e.name)
        except OSError:
            continue
    return sorted(found), True


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
        try:
            found = mapping.search(read_text(finder, 1 << 20))
        except OSError:
            continue
        if found and os.path.isdir(found.group(1)):
            return found.group(1)
    for pth in sorted(glob.glob(os.path.join(sp, "*.pth"))):
        try:
            pth_lines = read_text(pth, 1 << 16).splitlines()
        except OSError:
            continue
        for line in pth_lines:
            line = line.strip()
            if line and not line.startswith(("#", "import")):
                candidate = os.path.join(line, package)
                if os.path.isdir(candidate):
                    return candidate
    return None
