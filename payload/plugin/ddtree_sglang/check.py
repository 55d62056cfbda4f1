"""``python -I -m ddtree_sglang.check [--full]``: is the plugin installed and able to serve here?

Prints one JSON line and exits 0 when the venv's SGLang is a supported release, the entry point
is listed and DFLASH's worker has that release's constructor; 1 otherwise (``"error"`` says why).
Without ``--full`` nothing of sglang or torch is imported: SGLang's files are read (``ast``), so
the check runs where torch cannot (the tool's ``verify`` on any host). ``--full`` also imports
SGLang, registers the plugin and asks SGLang which class serves DDTREE (needs the full stack).
"""

from __future__ import annotations

import ast
import json
import sys
from importlib import metadata, util
from pathlib import Path
from typing import Any

from ddtree_sglang import __version__, releases

GROUP, ENTRY = "sglang.srt.plugins", "ddtree"


def _package_dir() -> Path:
    spec = util.find_spec("sglang")  # a top-level name: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("no sglang package in this environment")
    return Path(list(spec.submodule_search_locations)[0])


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def worker_ctor(package: Path) -> tuple[str, ...]:
    """DFlashWorkerV2.__init__'s parameters (after self), read from the file."""
    path = package / "srt" / "speculative" / "dflash_worker_v2.py"
    cls = _class(ast.parse(path.read_text(encoding="utf-8")), "DFlashWorkerV2")
    init = None if cls is None else next(
        (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if init is None:
        raise RuntimeError(f"{path}: no DFlashWorkerV2.__init__")
    args = init.args
    return tuple(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg != "self")


def upstream_ddtree(package: Path) -> bool:
    """Whether SGLang's own SpeculativeAlgorithm has a DDTREE member."""
    path = package / "srt" / "speculative" / "spec_info.py"
    cls = _class(ast.parse(path.read_text(encoding="utf-8")), "SpeculativeAlgorithm")
    return cls is not None and any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DDTREE"
                                          for t in n.targets) for n in cls.body)


def entry_point() -> bool:
    return any(ep.name == ENTRY and ep.value.startswith("ddtree_sglang.")
               for ep in metadata.entry_points(group=GROUP))


def light() -> dict[str, Any]:
    out: dict[str, Any] = {"plugin": __version__, "loaded": "file"}
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return {**out, "supported": False, "error": "sglang is not installed here"}
    out["sglang"] = version
    out["entry_point"] = entry_point()
    why = releases.refusal(version)
    if why is not None:
        return {**out, "supported": False, "error": why}
    package = _package_dir()
    params = worker_ctor(package)
    want = releases.SUPPORTED[version]["ctor"]
    upstream = upstream_ddtree(package)
    out.update(supported=True, worker_ctor="ps" if "ps" in params else "no_ps",
               ctor_matches=params == want, upstream_ddtree=upstream,
               serves="upstream" if upstream else "plugin",
               gpu_proven=version in releases.GPU_PROVEN,
               plugin_gpu_proven=__version__ in releases.PLUGIN_GPU_PROVEN)
    if not out["entry_point"]:
        out["error"] = f"entry point {ENTRY!r} of group {GROUP} is not listed"
    elif params != want:
        out["error"] = f"DFlashWorkerV2.__init__{params}, expected {want}"
    return out


def full(out: dict[str, Any]) -> dict[str, Any]:
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from ddtree_sglang import plugin

    name = plugin.register(out["sglang"], SpeculativeAlgorithm, spec_registry)
    algo = SpeculativeAlgorithm.from_string(name)
    return {**out, "loaded": "import", "registered": name,
            "spec_class": type(algo).__name__, "is_dflash_family": bool(algo.is_dflash_family())}


def main(argv: list[str]) -> int:
    try:
        out = light()
        if "--full" in argv and out.get("supported") and "error" not in out:
            out = full(out)
    except Exception as exc:  # one JSON line whatever happens
        out = {"plugin": __version__, "supported": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out, sort_keys=True))
    return 0 if out.get("supported") and "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
