"""Stand-in wheels for the packages too big for the lab: torch, triton, torchvision,
sglang-kernel and the CUDA libraries of the nvidia-* wheels.

Each stand-in has the real name, version, Requires-Dist and wheel tag, and shared
objects at the real paths with the real SONAME/DT_NEEDED/RPATH (see elfstub.py),
so pip, the dynamic loader and the deploy tool see what they would see on a GPU
host; it computes nothing. ``STANDIN.txt`` at the package root and the METADATA
Summary say so. Builds are content-stable: same inputs, same bytes.

Where the real packages came from (fixtures under shared/fixtures/real and the
registry's wheels, read 2026-11): torch 2.11.0 from PyPI is the CUDA 13.0 build
(dist-info ``torch-2.11.0``, no local tag); the cu128 build comes from PyTorch's
index and carries ``+cu128`` in its file name, dist-info and Version (pip rejects
a wheel whose file name and METADATA versions differ).
"""

from __future__ import annotations

import base64
import hashlib
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ddtree_lab import standin_templates as tpl
from ddtree_lab.elfstub import (
    CU12_RPATH,
    CU13_RPATH,
    LibSpec,
    build_libs,
    compile_shared,
    libcuda_spec,
    libnvml_spec,
    sglang_kernel_specs,
    torch_lib_specs,
)
from ddtree_lab.errors import LabError

Lane = Literal["cu128", "cu130"]
LANES: tuple[Lane, ...] = ("cu128", "cu130")

TORCH_VERSION = "2.11.0"
TORCH_GIT_VERSION = "70d99e998b4955e0049d13a98d77ae1b14db1f45"  # torch/version.py of 2.11.0
TRITON_VERSION = "3.6.0"  # torch 2.11.0 pins triton==3.6.0 on both lanes
TORCHVISION_VERSION = "0.26.0"  # the torchvision release that pins torch==2.11.0
SGLANG_KERNEL_VERSION = "0.4.2"
_ZIP_TIME = (2026, 1, 1, 0, 0, 0)
_NVIDIA_TAGS = ("py3-none-manylinux2014_x86_64", "py3-none-manylinux_2_17_x86_64")


@dataclass(frozen=True)
class NvidiaStandin:
    """One nvidia-* wheel: tiny libraries in nvidia/<folder>/lib (each needs libc; a
    libcublas.so.N also needs its libcublasLt.so.N, as the real one does)."""

    name: str
    version: str
    folder: str
    sonames: tuple[str, ...]

    def libs(self) -> list[LibSpec]:
        lt = [s for s in self.sonames if s.startswith("libcublasLt")]
        return [(s, (*([] if s in lt else lt), "libc.so.6"), ()) for s in self.sonames]


@dataclass(frozen=True)
class LaneSpec:
    lane: Lane
    cuda: str
    rpath: str
    requires: tuple[str, ...]
    nvidia: tuple[NvidiaStandin, ...]
    local_in_metadata: bool  # PyTorch-index builds keep the +cu130-style tag in dist-info

    @property
    def major(self) -> str:
        return self.cuda.split(".")[0]


_TOOLKIT = (
    "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]"
)
_TORCH_BASE = ("filelock", "typing-extensions>=4.10.0", "setuptools<82", "sympy>=1.13.3",
               "networkx>=2.5.1", "jinja2", "fsspec>=0.8.5")  # fmt: skip
_TORCH_EXTRAS = ("optree>=0.13.0", "opt-einsum>=3.3", "pyyaml")


def _lane(
    lane: Lane, toolkit: str, bindings: str, sparselt: str, cublas: str, nvrtc: str
) -> LaneSpec:
    """torch 2.11.0's Linux pins for a lane (Requires-Dist of the real wheels; cuda-toolkit's
    extras pin nvidia-cublas/nvrtc/runtime, whose versions are those of a real install)."""
    major = toolkit.split(".")[0]
    cu = f"cu{major}"
    pins = (f"{_TOOLKIT}=={toolkit}", f"cuda-bindings{bindings}", f"nvidia-cudnn-{cu}==9.19.0.56",
            f"nvidia-cusparselt-{cu}=={sparselt}", f"nvidia-nccl-{cu}==2.28.9",
            f"nvidia-nvshmem-{cu}==3.4.5", f"triton=={TRITON_VERSION}")  # fmt: skip
    requires = _TORCH_BASE + tuple(p + '; platform_system == "Linux"' for p in pins)
    requires += tuple(f'{r}; extra == "{r.split(">")[0]}"' for r in _TORCH_EXTRAS)
    # CUDA 13 toolkit wheels (no -cu13 suffix) all share nvidia/cu13/lib; CUDA 12 ones do not.
    suffix, blas_dir, rtc_dir = ("-cu12", "cublas", "cuda_nvrtc") if major == "12" else ("", cu, cu)
    nvidia = (
        NvidiaStandin(f"nvidia-cublas{suffix}", cublas, blas_dir,
                      (f"libcublasLt.so.{major}", f"libcublas.so.{major}")),
        NvidiaStandin(f"nvidia-cuda-nvrtc{suffix}", nvrtc, rtc_dir, (f"libnvrtc.so.{major}",)),
        NvidiaStandin(f"nvidia-cudnn-{cu}", "9.19.0.56", "cudnn", ("libcudnn.so.9",)),
        NvidiaStandin(f"nvidia-nccl-{cu}", "2.28.9", "nccl", ("libnccl.so.2",)),
        NvidiaStandin(f"nvidia-cusparselt-{cu}", sparselt, "cusparselt", ("libcusparseLt.so.0",)),
        NvidiaStandin(f"nvidia-nvshmem-{cu}", "3.4.5", "nvshmem", ("libnvshmem_host.so.3",)),
    )  # fmt: skip
    rpath = CU12_RPATH if major == "12" else CU13_RPATH
    cuda = "12.8" if major == "12" else "13.0"
    return LaneSpec(lane, cuda, rpath, requires, nvidia, local_in_metadata=major == "12")


LANE_SPECS: dict[Lane, LaneSpec] = {
    "cu128": _lane("cu128", "12.8.1", "<13,>=12.9.4", "0.7.1", "12.8.4.1", "12.8.93"),
    "cu130": _lane("cu130", "13.0.2", "<14,>=13.0.3", "0.8.0", "13.1.0.3", "13.0.88"),
}


def lane_spec(lane: str) -> LaneSpec:
    for known, spec in LANE_SPECS.items():
        if known == lane:
            return spec
    raise LabError(f"unknown CUDA lane {lane!r}", hint=f"use one of: {', '.join(LANES)}")


# --- wheel writing ---------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(
    out_dir: Path,
    *,
    name: str,
    version: str,
    tags: tuple[str, ...],
    metadata: str,
    files: dict[str, bytes],
    purelib: bool = False,
) -> Path:
    """Write a wheel: sorted entries, fixed timestamps, RECORD with urlsafe sha256 and sizes."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    wheel_txt = "Wheel-Version: 1.0\nGenerator: ddtree-deploy lab stand-in\n"
    wheel_txt += f"Root-Is-Purelib: {'true' if purelib else 'false'}\n"
    wheel_txt += "".join(f"Tag: {t}\n" for t in tags) + "\n"
    entries = dict(sorted(files.items()))
    entries[f"{info}/METADATA"] = metadata.encode()
    entries[f"{info}/WHEEL"] = wheel_txt.encode()
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in entries.items())
    entries[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    py, abi, plat = (".".join(dict.fromkeys(t.split("-")[i] for t in tags)) for i in range(3))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{dist}-{version}-{py}-{abi}-{plat}.whl"
    tmp = target.with_name(target.name + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for path, data in entries.items():
            zi = zipfile.ZipInfo(path, date_time=_ZIP_TIME)
            zi.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if path.endswith(".so") or ".so." in path else 0o644
            zi.external_attr = (0o100000 | mode) << 16
            zf.writestr(zi, data)
    tmp.replace(target)
    return target


def _metadata(
    name: str, version: str, summary: str, requires: tuple[str, ...] = (), python: str = ">=3.10"
) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Summary: {summary}", f"Requires-Python: {python}"]
    extras = dict.fromkeys(
        r.split('extra == "')[1].rstrip('"') for r in requires if "extra ==" in r
    )
    lines += [f"Provides-Extra: {e}" for e in extras]
    lines += [f"Requires-Dist: {r}" for r in requires]
    lines += ["Description-Content-Type: text/plain", "", tpl.NOTE.format(what=name), ""]
    return "\n".join(lines)


def _summary(what: str, why: str) -> str:
    return f"ddtree-deploy lab stand-in of {what} ({why}); same names and ELF markers, no compute"


def _standin_txt(what: str, why: str) -> bytes:
    return (tpl.NOTE.format(what=what) + f"\nWhy a stand-in: {why}.\n").encode()


# --- shared objects --------------------------------------------------------------------------


def _extract_cudart(cudart_wheel: Path, major: str, into: Path) -> Path:
    want = f"libcudart.so.{major}"
    try:
        with zipfile.ZipFile(cudart_wheel) as zf:
            member = next((n for n in zf.namelist() if n.endswith(f"/lib/{want}")), None)
            if member is None:
                raise LabError(
                    f"{cudart_wheel.name} has no {want}",
                    hint=f"pass the CUDA {major} runtime wheel (nvidia-cuda-runtime*)",
                )
            (into / want).write_bytes(zf.read(member))
    except (OSError, zipfile.BadZipFile) as exc:
        raise LabError(f"cannot read the CUDA runtime wheel {cudart_wheel}: {exc}") from exc
    return into


def _tree_files(root: Path, prefix: str) -> dict[str, bytes]:
    return {f"{prefix}/{p.name}": p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


# --- builders --------------------------------------------------------------------------------


def build_torch(out_dir: Path, lane: str, cudart_wheel: Path) -> Path:
    """torch 2.11.0 for ``lane``; its CUDA libraries link the real libcudart from cudart_wheel."""
    spec = lane_spec(lane)
    local = f"{TORCH_VERSION}+{spec.lane}"
    why = "the real wheel is about 900 MB and needs an NVIDIA GPU"
    with tempfile.TemporaryDirectory(prefix="ddtree-torch-") as tmp:
        libdir, cudart_dir = Path(tmp) / "lib", Path(tmp) / "cudart"
        libdir.mkdir()
        cudart_dir.mkdir()
        _extract_cudart(cudart_wheel, spec.major, cudart_dir)
        what = f"(lab stand-in of torch {local})"
        build_libs(libdir, torch_lib_specs(spec.major), spec.rpath, [cudart_dir], what)
        files = _tree_files(libdir, "torch/lib")
    files["torch/__init__.py"] = tpl.TORCH_INIT.replace("@VERSION@", local).encode()
    files["torch/version.py"] = tpl.TORCH_VERSION_PY.format(
        version=local, cuda=spec.cuda, git=TORCH_GIT_VERSION
    ).encode()
    files["torch/cuda/__init__.py"] = tpl.TORCH_CUDA.encode()
    files["torch/STANDIN.txt"] = _standin_txt(f"torch {local}", why)
    version = local if spec.local_in_metadata else TORCH_VERSION
    return write_wheel(
        out_dir,
        name="torch",
        version=version,
        tags=("cp311-cp311-manylinux_2_28_x86_64",),
        metadata=_metadata("torch", version, _summary(f"torch {local}", why), spec.requires),
        files=files,
    )


def build_triton(out_dir: Path) -> Path:
    why = "the real wheel is about 190 MB and compiles GPU kernels"
    files = {
        "triton/__init__.py": tpl.PURE_INIT.format(what="triton", version=TRITON_VERSION).encode(),
        "triton/STANDIN.txt": _standin_txt(f"triton {TRITON_VERSION}", why),
    }
    requires = ('importlib-metadata; python_version < "3.10"',)
    return write_wheel(
        out_dir,
        name="triton",
        version=TRITON_VERSION,
        tags=("cp311-cp311-manylinux_2_27_x86_64", "cp311-cp311-manylinux_2_28_x86_64"),
        metadata=_metadata(
            "triton", TRITON_VERSION, _summary("triton", why), requires, ">=3.10,<3.15"
        ),
        files=files,
    )


def build_torchvision(out_dir: Path, lane: str = "cu130") -> Path:
    spec = lane_spec(lane)
    local = f"{TORCHVISION_VERSION}+{spec.lane}"
    why = "it needs the real torch and CUDA image libraries"
    files = {
        "torchvision/__init__.py": tpl.TORCHVISION_INIT.encode(),
        "torchvision/version.py": tpl.TORCHVISION_VERSION_PY.format(version=local).encode(),
        "torchvision/STANDIN.txt": _standin_txt(f"torchvision {local}", why),
    }
    version = local if spec.local_in_metadata else TORCHVISION_VERSION
    requires = ("numpy", f"torch=={TORCH_VERSION}", "pillow!=8.3.*,>=5.3.0")
    return write_wheel(
        out_dir,
        name="torchvision",
        version=version,
        tags=("cp311-cp311-manylinux_2_28_x86_64",),
        metadata=_metadata("torchvision", version, _summary("torchvision", why), requires),
        files=files,
    )


def build_sglang_kernel(
    out_dir: Path, deps_dir: Path | None = None, *, with_libnuma: bool = False
) -> Path:
    """sglang-kernel 0.4.2 (CUDA 13 only). ``deps_dir``: optional libraries to link against
    (e.g. the stand-in torch/lib); names not found there are linked to empty stubs, which
    gives the same DT_NEEDED. libnuma.so.1 is left out by default: Debian 12's minimal
    system (the lab's containers) has no libnuma1, which the real wheel needs."""
    why = "the real wheel is 326 MB of CUDA 13 kernels"
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="ddtree-sgl-") as tmp:
        search = [deps_dir] if deps_dir is not None else []
        for path, so in sglang_kernel_specs(with_libnuma).items():
            built = compile_shared(so, Path(tmp) / path, search)
            files[path] = built.read_bytes()
    files["sgl_kernel/__init__.py"] = tpl.SGL_KERNEL_INIT.encode()
    files["sgl_kernel/version.py"] = f'__version__ = "{SGLANG_KERNEL_VERSION}"\n'.encode()
    files["sgl_kernel/STANDIN.txt"] = _standin_txt(f"sglang-kernel {SGLANG_KERNEL_VERSION}", why)
    files["deep_gemm/__init__.py"] = tpl.DEEP_GEMM_INIT.encode()
    return write_wheel(
        out_dir,
        name="sglang-kernel",
        version=SGLANG_KERNEL_VERSION,
        tags=("cp310-abi3-manylinux2014_x86_64",),
        metadata=_metadata("sglang-kernel", SGLANG_KERNEL_VERSION, _summary("sglang-kernel", why)),
        files=files,
    )


def build_nvidia_standins(out_dir: Path, lane: str) -> list[Path]:
    """The big nvidia-* wheels torch 2.11.0 pins for ``lane``, as tiny libraries at the real paths.

    CUDA 13 wheels share nvidia/cu13/lib with the real nvidia-cuda-runtime wheel and ship no
    __init__.py there (nor does the real runtime wheel), so no file is written twice. CUDA 12
    wheels each ship the empty nvidia/__init__.py, as the real ones do."""
    spec = lane_spec(lane)
    why = "the real wheel is hundreds of MB of GPU code"
    wheels: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="ddtree-nv-") as tmp:
        for pkg in spec.nvidia:
            libdir = Path(tmp) / pkg.name
            libdir.mkdir()
            what = f"(lab stand-in of {pkg.name} {pkg.version})"
            build_libs(libdir, pkg.libs(), "$ORIGIN", [], what)
            base = f"nvidia/{pkg.folder}"
            files = _tree_files(libdir, f"{base}/lib")
            if spec.lane == "cu128":
                for init in ("nvidia", base, f"{base}/lib"):
                    files[f"{init}/__init__.py"] = b""
            files[f"{base}/STANDIN-{pkg.name}.txt"] = _standin_txt(f"{pkg.name} {pkg.version}", why)
            summary = _summary(f"{pkg.name} {pkg.version}", why)
            wheels.append(
                write_wheel(
                    out_dir,
                    name=pkg.name,
                    version=pkg.version,
                    tags=_NVIDIA_TAGS,
                    metadata=_metadata(pkg.name, pkg.version, summary, python=">=3"),
                    files=files,
                    purelib=True,
                )
            )
    return wheels


def build_libcuda(out_path: Path, *, device_count: int = 0, driver_api: int = 13000) -> Path:
    """A stand-in libcuda.so.1 (driver R580 speaks CUDA 13.0: cuDriverGetVersion -> 13000)."""
    if device_count < 0 or driver_api <= 0:
        raise LabError("device_count must be >= 0 and driver_api > 0")
    return compile_shared(libcuda_spec(device_count, driver_api), out_path)


def build_libnvml(out_path: Path) -> Path:
    """A stand-in libnvidia-ml.so.1 (NVML) that reads the nvidia-smi stand-in's GPU spec and
    claims (standin/csrc/libnvml.c)."""
    return compile_shared(libnvml_spec(), out_path)
