"""Small ELF shared objects for the lab's stand-in wheels: build them with gcc, read them back.

A stand-in library matters only through what the dynamic loader sees: its SONAME,
its DT_NEEDED list (in order) and its RPATH. ``compile_shared`` links with
``-nostdlib`` so the DT_NEEDED list is exactly the one asked for, in that order:
system libraries (glibc, libstdc++, libgcc_s) are linked from this machine, a
library found in ``search`` is linked as is (e.g. the real libcudart.so.13 from
its wheel), and any other name gets an empty link-time stub carrying that SONAME.
Output is stripped and built from relative paths, so the same inputs give the
same bytes.

``read_dynamic`` reads them back with the facts probe's ELF reader (one reader for
the whole tool), in the shape the lab's tests use.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddtree_deploy.remote.facts_elf import ElfError, elf_dynamic
from ddtree_lab.errors import LabError

CSRC = Path(__file__).resolve().parent / "standin" / "csrc"

# Libraries every Debian 12 system has (glibc, gcc runtime): linked from this machine.
SYSTEM_SONAMES = frozenset(
    {
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "librt.so.1",
        "libpthread.so.0",
        "ld-linux-x86-64.so.2",
        "libstdc++.so.6",
        "libgcc_s.so.1",
    }
)

@dataclass(frozen=True)
class ElfDynamic:
    needed: tuple[str, ...]
    soname: str | None
    rpath: str | None
    runpath: str | None


def read_dynamic(path: Path) -> ElfDynamic:
    """NEEDED/SONAME/RPATH/RUNPATH of an x86-64 ELF file (the facts probe's reader);
    LabError if it is not one."""
    try:
        dyn = elf_dynamic(str(path))
    except ElfError as exc:
        raise LabError(f"{path} is not a 64-bit little-endian ELF file we can read: {exc}"
                       ) from exc
    return ElfDynamic(tuple(dyn["needed"]), dyn["soname"],
                      ":".join(dyn["rpath"]) or None, ":".join(dyn["runpath"]) or None)


def python_include_dir() -> Path:
    """Python.h of the interpreter running the build (for the stand-in extension modules)."""
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise LabError(
            f"Python.h not found in {include}",
            hint="install the Python development headers (Debian: python3-dev)",
        )
    return include


def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise LabError("gcc is not installed", hint="apt-get install gcc (the lab builds stubs)")
    return gcc


def make_stub(soname: str, stub_dir: Path) -> Path:
    """An empty shared object carrying ``soname``, for the link step only."""
    out = stub_dir / soname
    if out.exists():
        return out
    stub_dir.mkdir(parents=True, exist_ok=True)
    src = stub_dir / "empty.c"
    if not src.exists():
        src.write_text("/* link-time stub */\n")
    _run(
        [_gcc(), "-shared", "-nostdlib", "-o", soname, f"-Wl,-soname,{soname}", "empty.c"], stub_dir
    )
    return out


def _run(argv: Sequence[str], cwd: Path) -> None:
    try:
        proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, timeout=120, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"'{argv[0]}' did not finish within 120s") from exc
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()[-2000:]
        raise LabError(f"'{' '.join(argv)}' failed with exit code {proc.returncode}: {err}")


@dataclass(frozen=True)
class SharedObject:
    """How to link one stand-in: source, SONAME, DT_NEEDED (in order), RPATH, macros."""

    source: str  # a file name under standin/csrc
    needed: Sequence[str]
    soname: str | None = None
    rpath: str | None = None
    defines: tuple[tuple[str, str], ...] = ()
    python_ext: bool = False


def compile_shared(spec: SharedObject, out: Path, search: Sequence[Path] = ()) -> Path:
    """Compile ``spec`` into ``out``; DT_NEEDED as listed, libraries resolved as described above."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ddtree-elf-") as tmp:
        work = Path(tmp)
        shutil.copyfile(CSRC / spec.source, work / spec.source)
        link_dir = work / "link"
        link_dir.mkdir()
        for name in spec.needed:
            if name in SYSTEM_SONAMES:
                continue
            found = next((d / name for d in search if (d / name).is_file()), None)
            if found is not None:
                shutil.copyfile(found, link_dir / name)
            else:
                make_stub(name, link_dir)
        argv = [_gcc(), "-shared", "-fPIC", "-O2", "-s", "-nostdlib", "-fno-stack-protector"]
        argv += ["-fvisibility=hidden", "-o", "out.so", spec.source]
        if spec.python_ext:
            argv.append(f"-I{python_include_dir()}")
        for key, value in spec.defines:
            argv.append(f"-D{key}={value}")
        argv += ["-Wl,--no-as-needed", "-Wl,--disable-new-dtags", "-Llink"]
        if spec.soname:
            argv.append(f"-Wl,-soname,{spec.soname}")
        if spec.rpath:
            argv.append(f"-Wl,-rpath,{spec.rpath}")
        argv += [f"-l:{name}" for name in spec.needed]
        _run(argv, work)
        shutil.copyfile(work / "out.so", out)
    out.chmod(0o755)
    return out


# --- the stand-ins' link specs (DT_NEEDED lists copied from readelf -d of the real files) -----

LibSpec = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]  # SONAME, NEEDED, macros
_C = ("libc.so.6",)
_GLIBC = ("libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6")
CU12_RPATH = ":".join(  # libtorch_cuda.so of the torch 2.9.1 cu128 wheel (fixtures/real)
    [
        f"$ORIGIN/../../{d}/lib"
        for d in [
            "nvidia/cudnn",
            "nvidia/nvshmem",
            "nvidia/nccl",
            "nvidia/cusparselt",
            "nvidia/cublas",
            "nvidia/cuda_cupti",
            "nvidia/cuda_nvrtc",
            "nvidia/cuda_runtime",
            "nvidia/cufft",
            "nvidia/curand",
            "nvidia/cusolver",
            "nvidia/cusparse",
            "cusparselt",
            "nvidia/nvtx",
            "nvidia/cufile",
        ]
    ]
    + ["$ORIGIN"]
)
CU13_RPATH = (  # every torch/lib/*.so of torch 2.11.0+cu130 (fixtures/real/h200-cu130/elf.txt)
    "$ORIGIN/../../nvidia/cudnn/lib:$ORIGIN/../../nvidia/nvshmem/lib:$ORIGIN/../../nvidia/nccl/lib:"
    "$ORIGIN/../../nvidia/cusparselt/lib:$ORIGIN/../../nvidia/cu13/lib:$ORIGIN"
)


def torch_lib_specs(major: str) -> list[LibSpec]:
    """torch/lib stand-ins in build order. libtorch_cuda.so keeps the real order but only
    the CUDA libraries the lab ships (no cufft/curand/cusparse/cufile stand-ins)."""
    cudart, cublas, cublaslt = (
        f"libcudart.so.{major}",
        f"libcublas.so.{major}",
        f"libcublasLt.so.{major}",
    )
    ask_cudart = (("STANDIN_CUDART", "c10_cuda_standin_cudart_version"),)
    return [
        ("libgomp.so.1", ("libdl.so.2", "libpthread.so.0", *_C), ()),
        ("libc10.so", _GLIBC, ()),
        ("libtorch_global_deps.so", ("libpthread.so.0", "libm.so.6", "libdl.so.2", cudart,
                                     "libgomp.so.1", *_C), ()),
        ("libc10_cuda.so", ("libc10.so", "libdl.so.2", cudart, *_GLIBC, "ld-linux-x86-64.so.2"),
         ask_cudart),
        ("libtorch_cpu.so", ("libc10.so", "libgomp.so.1", "libdl.so.2", *_GLIBC), ()),
        ("libtorch_nvshmem.so", ("libnvshmem_host.so.3", cudart, *_GLIBC), ()),
        ("libtorch_cuda.so", ("libtorch_nvshmem.so", "libc10_cuda.so", cudart, "libcusparseLt.so.0",
                              "libnccl.so.2", cublas, cublaslt, "libcudnn.so.9", "librt.so.1",
                              "libdl.so.2", "libpthread.so.0", "libc10.so", "libtorch_cpu.so",
                              "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", *_C,
                              "ld-linux-x86-64.so.2"), ()),
        ("libtorch.so", ("libtorch_cpu.so", "libtorch_cuda.so", "libgcc_s.so.1",
                         "libpthread.so.0", *_C), ()),
        ("libcaffe2_nvrtc.so", (f"libnvrtc.so.{major}", "libcuda.so.1", *_GLIBC), ()),
    ]  # fmt: skip


def build_libs(dest: Path, libs: Sequence[LibSpec], rpath: str | None, search: Sequence[Path],
               what: str) -> None:  # fmt: skip
    """Compile each library into ``dest`` (earlier ones are linked by later ones)."""
    for soname, needed, extra in libs:
        stem = soname.removeprefix("lib").split(".")[0].replace("-", "_")
        label = (
            ("STANDIN_EXPORT", f"{stem}_standin_label"),
            ("STANDIN_LABEL", f'"{soname} {what}"'),
        )
        spec = SharedObject("standin_lib.c", needed, soname, rpath, label + extra)
        compile_shared(spec, dest / soname, [dest, *search])


def sglang_kernel_specs(with_libnuma: bool = False) -> dict[str, SharedObject]:
    """sglang-kernel 0.4.2's extension modules at their real paths, DT_NEEDED as the real
    ones (readelf -d of the registry's wheel), without RPATH as there."""
    head = ("libtorch.so", "libc10.so", "libnvrtc.so.13", "libc10_cuda.so", "libcuda.so.1")
    tail = ("libtorch_cpu.so", "libtorch_cuda.so", "libcudart.so.13")
    numa = ("libnuma.so.1",) if with_libnuma else ()
    common = (*head, "libcublas.so.13", "libcublasLt.so.13", *tail, *numa, "libdl.so.2",
              "libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libpthread.so.0", *_C,
              "ld-linux-x86-64.so.2")  # fmt: skip
    lean = (*head, *tail, "libstdc++.so.6", "libgcc_s.so.1", *_C)
    modules = {
        "sgl_kernel/sm90/common_ops.abi3.so": common,
        "sgl_kernel/sm100/common_ops.abi3.so": common,
        "sgl_kernel/flash_ops.abi3.so": (*head, *tail, "libdl.so.2", *_GLIBC),
        "sgl_kernel/flashmla_ops.abi3.so": (*head, *tail, *_GLIBC),
        "sgl_kernel/spatial_ops.abi3.so": lean,
        "deep_gemm/deep_gemm_cpp.abi3.so": lean,
    }
    out: dict[str, SharedObject] = {}
    for path, needed in modules.items():
        mod = path.rsplit("/", 1)[1].split(".", 1)[0]
        macros = (("MODULE_NAME", f'"{mod}"'), ("PYINIT", f"PyInit_{mod}"))
        out[path] = SharedObject("pyext.c", needed, defines=macros, python_ext=True)
    return out


def libcuda_spec(device_count: int, driver_api: int) -> SharedObject:
    macros = (("DEVICE_COUNT", str(device_count)), ("DRIVER_API_VERSION", str(driver_api)))
    return SharedObject("libcuda.c", _C, soname="libcuda.so.1", defines=macros)


def libnvml_spec() -> SharedObject:
    return SharedObject("libnvml.c", _C, soname="libnvidia-ml.so.1")
