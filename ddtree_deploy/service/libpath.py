"""The venv's nvidia library folders in the order the loader should search them (a unit's
LD_LIBRARY_PATH). Pure and light: planning uses it without loading the template engine."""

from __future__ import annotations

from pathlib import PurePosixPath

from ddtree_deploy.facts.model import Venv

_OTHER_ORDER = ("cudnn", "nccl", "nvshmem", "cusparselt")
_CU12_FIRST = ("cuda_runtime", "cuda_nvrtc", "cublas")


def _component(lib_dir: str) -> str:
    parts = PurePosixPath(lib_dir).parts  # .../nvidia/<component>/lib
    return parts[-2] if len(parts) >= 3 and parts[-1] == "lib" else lib_dir


def ld_library_path(venv: Venv) -> tuple[str, ...]:
    """The venv's real nvidia library folders, in loader search order.

    CUDA 13's nvidia/cu13/lib first (else CUDA 12's per-component folders, cudart
    first), then cuDNN, NCCL, NVSHMEM, cuSPARSELt, then any other, by name.
    """
    layout = venv.nvidia
    cu12 = set(layout.cu12_components)

    def rank(lib_dir: str) -> tuple[int, int, str]:
        comp = _component(lib_dir)
        if comp == "cu13":
            return (0, 0, comp)
        if comp in cu12:
            first = _CU12_FIRST.index(comp) if comp in _CU12_FIRST else len(_CU12_FIRST)
            return (1, first, comp)
        if comp in _OTHER_ORDER:
            return (2, _OTHER_ORDER.index(comp), comp)
        return (3, 0, comp)

    unique = list(dict.fromkeys(d.rstrip("/") for d in layout.lib_dirs if d))
    return tuple(sorted(unique, key=rank))
