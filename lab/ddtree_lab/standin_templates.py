"""File templates of the lab's stand-in packages (see standin_wheels.py).

Each generated module says it is a stand-in; none computes anything.
"""

from __future__ import annotations

NOTE = """\
LAB STAND-IN: this is not {what}. The ddtree-deploy lab (systemd-nspawn containers
without GPUs) installs it in place of the real package. It has the real name, version,
requirements, file layout and, for shared objects, the real SONAME, DT_NEEDED and
RPATH, so pip, the dynamic loader and the deploy tool behave as on a GPU host. It
computes nothing."""

TORCH_VERSION_PY = """\
from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '{version}'
debug = False
cuda: Optional[str] = '{cuda}'
git_version = '{git}'
hip: Optional[str] = None
rocm: Optional[str] = None
xpu: Optional[str] = None
"""

TORCH_INIT = '''\
"""Lab stand-in for torch @VERSION@ (see STANDIN.txt): no tensors, no kernels.

Importing it loads torch/lib the way torch does (libtorch_global_deps.so first, with
the CUDA libraries of the nvidia-* wheels preloaded when needed, then libtorch.so),
so a missing or mismatched CUDA library fails with the dynamic loader's own message.
"""

import ctypes
import glob
import os
import sys

from torch import version as version
from torch.version import __version__ as __version__

_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
# (folder of a CUDA 12 nvidia-* wheel, file); CUDA 13 wheels all use nvidia/cu13/lib.
_CUDA_LIBS = (
    ("cublas", "libcublasLt.so.*[0-9]"),
    ("cublas", "libcublas.so.*[0-9]"),
    ("cudnn", "libcudnn.so.*[0-9]"),
    ("cuda_nvrtc", "libnvrtc.so.*[0-9]"),
    ("cuda_runtime", "libcudart.so.*[0-9]"),
    ("cusparselt", "libcusparseLt.so.*[0-9]"),
    ("nccl", "libnccl.so.*[0-9]"),
    ("nvshmem", "libnvshmem_host.so.*[0-9]"),
)


def _find(folder, pattern):
    for entry in sys.path:
        for sub in (folder, "cu" + version.cuda.split(".")[0]):
            hits = sorted(glob.glob(os.path.join(entry, "nvidia", sub, "lib", pattern)))
            if hits:
                return hits[0]
    return None


def _preload(required):
    for folder, pattern in _CUDA_LIBS:
        path = _find(folder, pattern)
        if path is None and required:
            raise ValueError(f"{pattern} not found in the system path {sys.path}")
        if path is not None:
            try:
                ctypes.CDLL(path)
            except OSError:
                if required:
                    raise


def _load_global_deps():
    path = os.path.join(_LIB, "libtorch_global_deps.so")
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        if not any(p.split(".", 1)[0] in str(err) for _, p in _CUDA_LIBS):
            raise
        _preload(required=True)
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        return
    with open("/proc/self/maps") as maps:
        if "libcudart.so" in maps.read():
            _preload(required=False)


def _load_libtorch():
    try:
        return ctypes.CDLL(os.path.join(_LIB, "libtorch.so"), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:  # real torch reports these from `from torch._C import *`
        raise ImportError(str(err)) from None


_load_global_deps()
_libtorch = _load_libtorch()


def _standin_cudart_version():
    """What the linked libcudart answers to cudaRuntimeGetVersion (13000 for CUDA 13.0)."""
    lib = ctypes.CDLL(os.path.join(_LIB, "libc10_cuda.so"))
    return int(lib.c10_cuda_standin_cudart_version())


from torch import cuda as cuda  # noqa: E402
'''

TORCH_CUDA = '''\
"""torch.cuda of the lab stand-in: asks the driver library (libcuda.so.1) for devices."""

import ctypes


def _driver():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def device_count():
    drv = _driver()
    count = ctypes.c_int(0)
    if drv is None or drv.cuInit(0) != 0 or drv.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def is_available():
    return device_count() > 0
'''

PURE_INIT = '''\
"""Lab stand-in for {what} {version} (see STANDIN.txt): importable, computes nothing."""

__version__ = "{version}"
'''

TORCHVISION_INIT = '''\
"""Lab stand-in for torchvision (see STANDIN.txt): imports torch as the real one does."""

import torch  # noqa: F401

from torchvision.version import __version__ as __version__
'''

TORCHVISION_VERSION_PY = "__version__ = '{version}'\ngit_version = 'standin'\n"

SGL_KERNEL_INIT = '''\
"""Lab stand-in for sglang-kernel 0.4.2 (see STANDIN.txt): no kernels.

Like the real package it imports torch, then loads the compiled ops module for the GPU
architecture as an extension module; a missing CUDA 13 library fails with the loader's
own message. The real loader picks sm90 only for compute capability 9.0 and sm100
otherwise (and with no GPU): lab GPUs are 8.6 and 12.0, so sm100.
"""

import importlib.util
import os

import torch  # noqa: F401

from sgl_kernel.version import __version__ as __version__

_OPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sm100", "common_ops.abi3.so")


def _load_common_ops():
    try:
        spec = importlib.util.spec_from_file_location("common_ops", _OPS)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except ImportError as err:
        raise ImportError(
            "[sgl_kernel] CRITICAL: Could not load any common_ops library!\\n"
            f"- {type(err).__name__}: {err}"
        ) from err


common_ops = _load_common_ops()
'''

DEEP_GEMM_INIT = '''\
"""Lab stand-in for deep_gemm as shipped in sglang-kernel 0.4.2 (no kernels)."""

import torch  # noqa: F401

from deep_gemm import deep_gemm_cpp as deep_gemm_cpp
'''
