"""The start-up checks real SGLang makes, answered from the REAL state of the venv and host.

Each check either does the real thing (``import sgl_kernel``, ``import
soundfile``, the real ``SpeculativeAlgorithm.from_string``) or, where the real
package cannot be imported here (flashinfer and xgrammar import torch or native
libraries at top level), reads the installed files: which names a package
defines, which names the installed sglang imports from it. Failures raise the
error Python or the real library would raise, with the same text. Nothing is
decided by a flag or variable that says "fail".
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

_MAX_STAR_DEPTH = 3
CUDA_TAIL = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, "
    "so the stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


# -- reading installed packages without importing them -------------------------------


def package_dir(name: str) -> Path | None:
    """Folder of an installed top-level package (found, not imported)."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent if spec.origin else None


def sglang_dir() -> Path:
    module = sys.modules.get("sglang") or importlib.import_module("sglang")
    return Path(list(module.__path__)[0])


def _bound_names(tree: ast.Module, folder: Path, depth: int) -> tuple[set[str], bool]:
    """Names a module binds at top level (also inside if/try/with); plus 'dynamic'."""
    names: set[str] = set()
    dynamic = False
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*" and isinstance(node, ast.ImportFrom):
                    sub = _star_source(folder, node)
                    if sub is None or depth >= _MAX_STAR_DEPTH:
                        dynamic = True
                    else:
                        more, dyn = _file_names(sub, depth + 1)
                        names |= more
                        dynamic |= dyn
                else:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            dynamic |= node.name == "__getattr__"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo.extend(node.body)
            todo.extend(getattr(node, "orelse", []))
            todo.extend(getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)
    return names, dynamic


def _star_source(folder: Path, node: ast.ImportFrom) -> Path | None:
    if node.level != 1 or not node.module:
        return None
    base = folder.joinpath(*node.module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _file_names(path: Path, depth: int = 0) -> tuple[set[str], bool]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return _bound_names(tree, path.parent, depth)


def defines_name(init_file: Path, name: str) -> bool:
    """Whether ``from <package> import name`` would find ``name`` (static answer)."""
    names, dynamic = _file_names(init_file)
    return name in names or dynamic


def imported_names(source: Path, module: str, guard: str | None = None) -> list[str]:
    """Names ``source`` imports from ``module`` at top level, in order.

    With ``guard``, only imports under a top-level ``if`` whose test mentions it.
    """
    if not source.is_file():
        return []
    tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    found: list[str] = []
    for node in tree.body:
        if guard is not None:
            if not (isinstance(node, ast.If) and guard in ast.unparse(node.test)):
                continue
            body: list[ast.stmt] = node.body
        else:
            body = [node]
        for stmt in body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == module and stmt.level == 0:
                found.extend(a.name for a in stmt.names)
    return found


def imports_at_top(source: Path, module: str) -> bool:
    if not source.is_file():
        return False
    tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    return any(
        isinstance(node, ast.Import) and any(a.name == module for a in node.names)
        for node in tree.body
    )


def require_names(package: str, names: list[str]) -> None:
    """Raise the ImportError Python raises for the first name the package lacks."""
    folder = package_dir(package)
    if folder is None:
        raise ModuleNotFoundError(f"No module named '{package}'", name=package)
    init_file = folder / "__init__.py"
    for name in names:
        if not defines_name(init_file, name):
            raise ImportError(
                f"cannot import name '{name}' from '{package}' ({init_file})",
                name=package,
                path=str(init_file),
            )


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` read from the installed torch/version.py."""
    folder = package_dir("torch")
    if folder is None:
        return None
    try:
        text = (folder / "version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([0-9.]+)['\"]", text, re.M)
    return match.group(1) if match else None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


# -- the checks --------------------------------------------------------------------


def is_blackwell(capability: tuple[int, int] | None, torch_cuda: str | None) -> bool:
    """sglang's is_blackwell_supported(): SM 10/11/12 and torch CUDA >= 12.8."""
    if capability is None or torch_cuda is None:
        return False
    return capability[0] in (10, 11, 12) and _version_tuple(torch_cuda) >= (12, 8)


def check_sgl_kernel() -> None:
    importlib.import_module("sgl_kernel")


def check_flashinfer_blackwell_imports(root: Path) -> None:
    """fp8_utils.py's ``if is_blackwell_supported() and is_flashinfer_available():`` imports."""
    if package_dir("flashinfer") is None:
        return  # is_flashinfer_available() is False: sglang skips these imports
    source = root / "srt" / "layers" / "quantization" / "fp8_utils.py"
    require_names("flashinfer", imported_names(source, "flashinfer", "is_blackwell_supported"))


def check_soundfile(root: Path) -> None:
    """0.5.11's HTTP server imports streaming_asr, which imports soundfile at top."""
    openai = root / "srt" / "entrypoints" / "openai"
    if any(imports_at_top(openai / f, "soundfile") for f in ("streaming_asr.py",)) or (
        imports_at_top(root / "srt" / "entrypoints" / "http_server.py", "soundfile")
    ):
        importlib.import_module("soundfile")


def check_grammar_backend(root: Path, backend: str | None) -> None:
    if backend not in (None, "xgrammar"):
        return
    source = root / "srt" / "constrained" / "xgrammar_backend.py"
    require_names("xgrammar", imported_names(source, "xgrammar"))


def nvcc_cuda_version(torch_cuda: str | None) -> str:
    """The CUDA version as flashinfer's get_cuda_version() finds it."""
    try:
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        if cuda_home is None:
            nvcc_path = shutil.which("nvcc")
            if nvcc_path:
                cuda_home = os.path.dirname(os.path.dirname(nvcc_path))
            else:
                cuda_home = "/usr/local/cuda"
                if not os.path.exists(cuda_home):
                    raise RuntimeError(
                        f"Could not find nvcc and default {cuda_home=} doesn't exist"
                    )
        text = subprocess.check_output(
            [os.path.join(cuda_home, "bin/nvcc"), "--version"], text=True, timeout=30
        )
        matches = re.findall(r"release (\d+\.\d+),", text)
        if not matches:
            raise RuntimeError(f"Could not parse CUDA version from nvcc --version output: {text}")
        return str(matches[0])
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        if torch_cuda is None:
            raise RuntimeError(
                "nvcc not found and PyTorch is not built with CUDA support. "
                "Could not determine CUDA version."
            ) from exc
        return torch_cuda


def _flashinfer_warning(folder: Path, message: str) -> None:
    source = folder / "compilation_context.py"
    lineno = 0
    for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
        if "Failed to get device capability" in line:
            lineno = n
    stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f",{int(time.time() * 1000) % 1000:03d}"
    print(
        f"{stamp} - WARNING - compilation_context.py:{lineno} - flashinfer.jit: "
        f"Failed to get device capability: {message}.",
        file=sys.stderr,
        flush=True,
    )


def check_flashinfer_arch(capabilities: list[tuple[int, int]], torch_cuda: str | None) -> None:
    """flashinfer's CompilationContext + check_cuda_arch() for the visible GPUs."""
    folder = package_dir("flashinfer")
    if folder is None:
        return
    context = folder / "compilation_context.py"
    guarded = context.is_file() and "SM 12.x requires CUDA" in context.read_text(encoding="utf-8")
    archs: list[tuple[int, int]] = []
    for major, minor in capabilities:
        if major == 12 and guarded:
            version = nvcc_cuda_version(torch_cuda)
            if _version_tuple(version) < (12, 9):
                _flashinfer_warning(folder, "SM 12.x requires CUDA >= 12.9")
                continue
        archs.append((major, minor))
    if not any(major >= 8 or (major == 7 and minor >= 5) for major, minor in archs):
        raise RuntimeError("FlashInfer requires GPUs with sm75 or higher")


def cuda_busy_error() -> RuntimeError:
    return RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable" + CUDA_TAIL)


def cuda_ordinal_error() -> RuntimeError:
    return RuntimeError("CUDA error: invalid device ordinal" + CUDA_TAIL)
