"""The probe's sglang part (DFlash/DDTree modules, SpeculativeAlgorithm, server flags) and the
names flashinfer/xgrammar export, all read from files without importing those packages.

spec_info.py is loaded BY FILE PATH in the venv's own python (`-I -S`: no site-packages, no
.pth hooks), so `import sglang` (which imports torch) never runs; if that fails (an import the
file needs, a broken interpreter), the enum is read statically with ast instead.
Part of the probe bundle (remote/bundle.py): stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ast

from ddtree_deploy.remote.facts_memo import Memo

SPEC_TIMEOUT_S = 10.0
SPEC_TIMEOUT_TEXT = "loading spec_info.py took more than"
SPEC_NO_RUN_TEXT = "cannot run"
WANTED_NAMES = {"flashinfer": ["mm_mxfp8"], "xgrammar": ["StructuralTag"]}
NAME_SCAN_DEPTH = 4

# Runs in the venv's interpreter: argv[1] is spec_info.py. Prints one JSON object.
SPEC_SCRIPT = r"""
import importlib.util, json, sys
out = {}
try:
    spec = importlib.util.spec_from_file_location("sglang.srt.speculative.spec_info", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    cls = mod.SpeculativeAlgorithm
    try:
        members = [m.name for m in cls]
    except TypeError:
        members = sorted(n for n in dir(cls) if n.isupper())
    out["members"] = members
    algo = None
    for how in ("item", "from_string", "attr"):
        try:
            if how == "item":
                algo = cls["DDTREE"]
            elif how == "from_string":
                algo = cls.from_string("ddtree")
            else:
                algo = getattr(cls, "DDTREE")
            break
        except Exception:
            algo = None
    out["knows"] = algo is not None
    if algo is not None:
        check = getattr(algo, "is_dflash", None)
        out["is_dflash"] = bool(check()) if callable(check) else None
except BaseException as exc:
    out = {"error": "%s: %s" % (type(exc).__name__, exc)}
print(json.dumps(out))
"""


def spec_info_static(text: str) -> dict[str, Any]:
    """SpeculativeAlgorithm's members and whether is_dflash() names DDTREE, read with ast."""
    import ast  # loaded only when a file is parsed (often the memo knows)

    tree = ast.parse(text)
    cls = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm"),
        None,
    )
    if cls is None:
        raise ValueError("no class SpeculativeAlgorithm in spec_info.py")
    members: list[str] = []
    is_dflash_src = None
    for node in cls.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Name) and target.id.isupper():
                members.append(target.id)
        if isinstance(node, ast.FunctionDef) and node.name == "is_dflash":
            is_dflash_src = ast.get_source_segment(text, node) or ""
    knows = "DDTREE" in members
    out: dict[str, Any] = {"members": members, "knows": knows}
    if knows:
        out["is_dflash"] = bool(is_dflash_src and re.search(r"\bDDTREE\b", is_dflash_src))
    return out


def spec_info_runtime(
    python: str, spec_path: str, timeout: float = SPEC_TIMEOUT_S
) -> dict[str, Any]:
    """Load spec_info.py by path in `python`; {"members", "knows", "is_dflash"} or {"error"}."""
    try:
        proc = subprocess.run(
            [python, "-B", "-I", "-S", "-c", SPEC_SCRIPT, spec_path],  # -B: writes nothing
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"{SPEC_TIMEOUT_TEXT} {timeout:.0f}s"}
    except OSError as exc:
        return {"error": f"{SPEC_NO_RUN_TEXT} {python}: {exc.strerror or exc}"}
    text = proc.stdout.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        err = proc.stderr.decode("utf-8", "replace").strip()[-500:]
        return {"error": f"{python} exited {proc.returncode}: {err or text[-500:]}"}
    return data


def sglang_info(
    python: str, pkg_dir: str | None, version: str | None, timeout: float = SPEC_TIMEOUT_S,
    memo: Memo | None = None,
) -> dict[str, Any] | None:
    """The SglangInfo dict for a venv whose sglang package lives at pkg_dir (None: absent)."""
    if pkg_dir is None and version is None:
        return None
    info: dict[str, Any] = {
        "version": version, "dflash_modules": [], "ddtree_modules": [], "spec_algorithms": [],
        "knows_ddtree": None, "ddtree_is_dflash": None, "server_flags": [], "spec_error": None,
    }  # fmt: skip
    if pkg_dir is None:
        info["spec_error"] = "sglang is installed (dist-info) but its package folder is missing"
        return info
    spec_dir = os.path.join(pkg_dir, "srt", "speculative")
    files = sorted(os.listdir(spec_dir)) if os.path.isdir(spec_dir) else []
    info["dflash_modules"] = [f for f in files if f.startswith("dflash") and f.endswith(".py")]
    info["ddtree_modules"] = [f for f in files if f.startswith("ddtree") and f.endswith(".py")]
    server_args = os.path.join(pkg_dir, "srt", "server_args.py")
    if os.path.isfile(server_args):
        with open(server_args, encoding="utf-8", errors="replace") as fh:
            flags = set(re.findall(r"--speculative-ddtree-[a-z0-9-]*[a-z0-9]", fh.read()))
        info["server_flags"] = sorted(flags)
    spec_path = os.path.join(spec_dir, "spec_info.py")
    if not os.path.isfile(spec_path):
        info["spec_error"] = "sglang/srt/speculative/spec_info.py is missing"
        return info
    # The answer depends on spec_info.py and the interpreter only (-I -S): remembered while
    # both are unchanged, except a timeout or an interpreter that would not start (passing).
    data = (memo or Memo()).derive("spec_info", f"{python}|{spec_path}", [python, spec_path],
                                   spec_info_runtime, python, spec_path, timeout,
                                   keep=lambda d: not str(d.get("error", "")).startswith(
                                       (SPEC_TIMEOUT_TEXT, SPEC_NO_RUN_TEXT)))
    data = dict(data)  # a copy: the memo keeps its own
    if "error" in data:
        runtime_error = data["error"]
        try:
            with open(spec_path, encoding="utf-8", errors="replace") as fh:
                data = spec_info_static(fh.read())
            data["source"] = "static"
            data["runtime_error"] = runtime_error
        except (SyntaxError, ValueError, OSError) as exc:
            info["spec_error"] = f"{runtime_error}; static read failed too: {exc}"
            return info
    else:
        data["source"] = "runtime"
    info["spec_algorithms"] = list(data.get("members") or [])
    info["knows_ddtree"] = bool(data.get("knows"))
    info["ddtree_is_dflash"] = data.get("is_dflash") if data.get("knows") else False
    info["spec_source"] = data["source"]
    info["spec_runtime_error"] = data.get("runtime_error")
    return info


PAYLOAD_STATE = (".ddtree-deploy", "payload.json")  # written by remote/payload.py
PAYLOAD_STATE_MAX = 1 << 20


def payload_state(venv: str) -> dict[str, Any] | None:
    """The payload a venv holds (its .ddtree-deploy/payload.json): name, version, content
    digest, and whether its files are still the bytes it installed. The state's paths are
    followed only inside the venv, to regular files; None when the venv has no payload."""
    import stat

    path = os.path.join(venv, *PAYLOAD_STATE)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    out: dict[str, Any] = {"payload": None, "version": None, "digest": None, "intact": None,
                           "error": None}
    if not stat.S_ISREG(st.st_mode) or st.st_size > PAYLOAD_STATE_MAX:
        out["error"] = f"{path} is not a regular file of at most 1 MiB"
        return out
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(PAYLOAD_STATE_MAX).decode("utf-8"))
    except (OSError, ValueError) as exc:
        out["error"] = f"{path}: {exc}"
        return out
    files = doc.get("files") if isinstance(doc, dict) else None
    pkg = doc.get("package_dir") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not isinstance(pkg, str):
        out["error"] = f"{path} is not a payload state"
        return out
    for key in ("payload", "version", "digest", "sglang"):
        out[key] = doc.get(key) if isinstance(doc.get(key), str) else None
    out["form"] = "plugin" if doc.get("form") == "plugin" else "patch"
    root, pkg_real = os.path.realpath(venv), os.path.realpath(pkg)
    if not pkg_real.startswith(root + os.sep):
        out["error"] = f"{path} names a package folder outside the venv"
        return out
    import hashlib

    intact = True
    for rel, want in files.items():
        file = os.path.realpath(os.path.join(pkg_real, str(rel)))
        if not file.startswith(pkg_real + os.sep) or not os.path.isfile(file) \
                or os.path.getsize(file) > 64 << 20:
            intact = False
            continue
        with open(file, "rb") as fh:
            intact = intact and hashlib.sha256(fh.read()).hexdigest() == want
    out["intact"] = intact
    return out


# ---- exported names ----------------------------------------------------------------------------


def _module_file(pkg_dir: str, base_parts: list[str], module: str | None,
                 track: Callable[[str], None]) -> str | None:
    parts = base_parts + (module.split(".") if module else [])
    stem = os.path.join(pkg_dir, *parts) if parts else pkg_dir
    for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
        track(candidate)
        if os.path.isfile(candidate):
            return candidate
    return None


def module_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module-level statements, including those inside if/try/with blocks (not defs)."""
    import ast  # loaded only when a file is parsed (often the memo knows)

    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        for field in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                out += module_statements(getattr(node, field, None) or [])
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                out += module_statements(handler.body)
    return out


def defines_name(pkg_dir: str, rel_parts: list[str], path: str, name: str, depth: int,
                 track: Callable[[str], None] = lambda _p: None) -> bool:
    """Whether the module at `path` (rel_parts: its package inside pkg_dir) binds `name`,
    following `from .x import name` / `from .x import *` into the package's own files.
    track(path) is told of every file read or looked for."""
    import ast  # loaded only when a file is parsed (often the memo knows)

    track(path)
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    try:
        tree = ast.parse(text)
    except SyntaxError:  # newer syntax than this interpreter: a plain text search
        pattern = r"(def|class|import)\b[^\n]*\b" + re.escape(name) + r"\b|^" + re.escape(name)
        return re.search(pattern + r"\s*=", text, re.M) is not None
    for node in module_statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return True
        elif isinstance(node, ast.Import):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            hits = [a for a in node.names if (a.asname or a.name) == name or a.name == "*"]
            if not hits:
                continue
            if node.level == 0 or depth <= 0:
                if any(a.name != "*" for a in hits):
                    return True
                continue
            base = rel_parts[: len(rel_parts) - (node.level - 1)] if node.level > 1 else rel_parts
            target = _module_file(pkg_dir, list(base), node.module, track)
            for alias in hits:
                wanted = name if alias.name == "*" else alias.name
                if target is None:
                    if alias.name != "*":
                        return True  # a compiled module or a submodule folder: trust it
                    continue
                sub = os.path.relpath(os.path.dirname(target), pkg_dir)
                sub_parts = [] if sub == "." else sub.split(os.sep)
                if defines_name(pkg_dir, sub_parts, target, wanted, depth - 1, track):
                    return True
    return False


def exported_names(pkg_dir: str, wanted: list[str], memo: Memo | None = None) -> list[str]:
    """Those of `wanted` that the package's __init__.py exports (read, not imported)."""

    def scan(track: Callable[[str], None]) -> list[str]:
        init = os.path.join(pkg_dir, "__init__.py")
        track(init)
        if not os.path.isfile(init):
            return []
        return [n for n in wanted if defines_name(pkg_dir, [], init, n, NAME_SCAN_DEPTH, track)]

    return list((memo or Memo()).derive_tracked("names", f"{pkg_dir}|{','.join(wanted)}", scan))
