"""The lab's stand-in wheels: metadata and ELF markers as the real packages, real loader errors.

Expected values come from the real packages where we have them: tests/facts/real
(readelf -d and METADATA of the registry's torch and sglang-kernel wheels, an H200
host's torch 2.11.0+cu130) and the real CUDA runtime wheels. Import checks run in
python3.11 venvs through ``ld.so --inhibit-cache``, so a CUDA toolkit registered in
this machine's ld.so.cache cannot hide a missing library (lab containers have none).
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import wheelcache

from ddtree_lab import standin_wheels as sw
from ddtree_lab.elfstub import read_dynamic
from ddtree_lab.errors import LabError

# Copies of shared/fixtures/real (tests/facts/real/SOURCES.txt says where each came from).
FIXTURES = Path(__file__).parent / "facts" / "real"
RUNTIME = {  # the real runtime wheels (tests/wheels.toml)
    "cu130": ("nvidia-cuda-runtime", "13.0.96"),
    "cu128": ("nvidia-cuda-runtime-cu12", "12.8.90"),
}
LDSO = Path("/lib64/ld-linux-x86-64.so.2")
NOT_FOUND = "cannot open shared object file: No such file or directory"


def _runtime_wheel(lane: str) -> Path:
    return wheelcache.wheel(*RUNTIME[lane])


def _python311() -> str:
    for cand in ("/usr/bin/python3.11", shutil.which("python3.11")):
        if cand and Path(cand).exists():
            return cand
    pytest.skip("python3.11 not available")


def _build_all(out: Path) -> dict[str, list[Path]]:
    wheels: dict[str, list[Path]] = {}
    for lane in sw.LANES:
        d = out / lane
        wheels[lane] = [
            sw.build_torch(d, lane, _runtime_wheel(lane)),
            *sw.build_nvidia_standins(d, lane),
            sw.build_torchvision(d, lane),
            sw.build_triton(d),
        ]
    wheels["sgl"] = [sw.build_sglang_kernel(out / "sgl")]
    return wheels


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    return _build_all(tmp_path_factory.mktemp("standins"))


def _wheel(built: dict[str, list[Path]], group: str, prefix: str) -> Path:
    return next(w for w in built[group] if w.name.startswith(prefix))


def _fixture_needed(text: str) -> list[str]:
    return [ln.split("[", 1)[1].rstrip("]") for ln in text.splitlines() if "(NEEDED)" in ln]


def _fixture_rpath(text: str) -> str:
    line = next(ln for ln in text.splitlines() if "(RPATH)" in ln)
    return line.split("[", 1)[1].rsplit("]", 1)[0]


def _sections(path: Path) -> dict[str, str]:
    parts = path.read_text().split("## ")[1:]
    return {p.splitlines()[0].strip(): p for p in parts}


# --- wheel files --------------------------------------------------------------------------


def test_record_hashes_sizes_and_standin_labels(built: dict[str, list[Path]]) -> None:
    for wheel in [w for group in built.values() for w in group]:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            assert names == sorted(names[:-3]) + names[-3:], wheel.name  # sorted, dist-info last
            record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
            rows = [r.split(",") for r in zf.read(record_name).decode().splitlines()]
            assert {r[0] for r in rows} == set(names)
            for path, digest, size in rows:
                if path == record_name:
                    assert (digest, size) == ("", "")
                    continue
                data = zf.read(path)
                want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert digest == "sha256=" + want.decode() and int(size) == len(data), path
            info = record_name.rsplit("/", 1)[0]
            meta = zf.read(f"{info}/METADATA").decode()
            wheel_txt = zf.read(f"{info}/WHEEL").decode()
            assert "stand-in" in next(ln for ln in meta.splitlines() if ln.startswith("Summary:"))
            assert any("STANDIN" in n and b"LAB STAND-IN" in zf.read(n) for n in names)
            for tag in [ln[5:] for ln in wheel_txt.splitlines() if ln.startswith("Tag: ")]:
                py, abi, plat = tag.split("-")
                stem = wheel.name[: -len(".whl")]
                assert py in stem and abi in stem and plat in stem


def _metadata(wheel: Path) -> tuple[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        info = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return info.split("/")[0], zf.read(info).decode()


def test_torch_cu130_metadata_is_the_real_one(built: dict[str, list[Path]]) -> None:
    wheel = _wheel(built, "cu130", "torch-")
    assert wheel.name == "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    info, meta = _metadata(wheel)
    real = (FIXTURES / "h200-cu130" / "torch-metadata.txt").read_text()
    assert info == "torch-2.11.0.dist-info"
    assert "\nVersion: 2.11.0\n" in meta

    def requires(text: str) -> set[str]:
        return {ln for ln in text.split("\n\n", 1)[0].splitlines() if ln.startswith("Requires-")}

    assert requires(meta) == requires(real)


def test_torch_cu128_carries_the_local_tag_and_cu12_pins(built: dict[str, list[Path]]) -> None:
    wheel = _wheel(built, "cu128", "torch-")
    assert wheel.name == "torch-2.11.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl"
    info, meta = _metadata(wheel)
    assert info == "torch-2.11.0+cu128.dist-info" and "\nVersion: 2.11.0+cu128\n" in meta
    assert 'Requires-Dist: nvidia-cudnn-cu12==9.19.0.56; platform_system == "Linux"' in meta
    assert "cu13" not in meta and "triton==3.6.0" in meta


@pytest.mark.parametrize("lane", sw.LANES)
def test_torch_version_py_has_the_real_fields(built: dict[str, list[Path]], lane: str) -> None:
    with zipfile.ZipFile(_wheel(built, lane, "torch-")) as zf:
        ours: dict[str, Any] = {}
        exec(zf.read("torch/version.py").decode(), ours)
    real: dict[str, Any] = {}
    exec((FIXTURES / "torch-2.9.1-cu128-pypi" / "version.py.txt").read_text(), real)
    assert set(real["__all__"]) <= set(ours["__all__"])
    assert ours["__version__"] == f"2.11.0+{lane}"
    assert ours["cuda"] == sw.lane_spec(lane).cuda and ours["hip"] is None


def test_sglang_kernel_metadata_matches_the_fixture(built: dict[str, list[Path]]) -> None:
    wheel = built["sgl"][0]
    assert wheel.name == "sglang_kernel-0.4.2-cp310-abi3-manylinux2014_x86_64.whl"
    _, meta = _metadata(wheel)
    real = (FIXTURES / "sglang-kernel-0.4.2-pypi" / "METADATA.head").read_text()
    for line in real.splitlines():
        if not line.startswith("Metadata-Version"):
            assert line in meta.splitlines()
    assert "Requires-Dist" not in meta  # the real wheel declares none


# --- ELF markers --------------------------------------------------------------------------


def _extract(wheel: Path, member: str, dest: Path) -> Path:
    out = dest / member.replace("/", "_")
    with zipfile.ZipFile(wheel) as zf:
        out.write_bytes(zf.read(member))
    return out


@pytest.mark.parametrize("lane", sw.LANES)
def test_libtorch_cuda_rpath_and_needed_follow_the_real(
    built: dict[str, list[Path]], lane: str, tmp_path: Path
) -> None:
    wheel = _wheel(built, lane, "torch-")
    dyn = read_dynamic(_extract(wheel, "torch/lib/libtorch_cuda.so", tmp_path))
    real = (
        (FIXTURES / "h200-cu130" / "elf.txt").read_text()
        if lane == "cu130"
        else (FIXTURES / "torch-2.9.1-cu128-pypi" / "readelf-d-libtorch_cuda.txt").read_text()
    )
    real_needed = _fixture_needed(real)[:22]  # elf.txt also lists libtriton.so after these
    assert dyn.rpath == _fixture_rpath(real) and dyn.runpath is None
    assert dyn.soname == "libtorch_cuda.so"
    it = iter(real_needed)
    assert all(name in it for name in dyn.needed), "NEEDED must keep the real order"
    major = sw.lane_spec(lane).major
    for name in (f"libcudart.so.{major}", f"libcublas.so.{major}", "libcudnn.so.9"):
        assert name in dyn.needed
    c10 = read_dynamic(_extract(wheel, "torch/lib/libc10_cuda.so", tmp_path))
    assert f"libcudart.so.{major}" in c10.needed and c10.rpath == dyn.rpath


def test_sglang_kernel_needed_is_the_real_list(
    built: dict[str, list[Path]], tmp_path: Path
) -> None:
    real = _sections(FIXTURES / "sglang-kernel-0.4.2-pypi" / "readelf-d.txt")
    with_numa = sw.build_sglang_kernel(tmp_path / "numa", with_libnuma=True)
    for member, text in real.items():
        want = _fixture_needed(text)
        plain = read_dynamic(_extract(built["sgl"][0], member, tmp_path))
        numa = read_dynamic(_extract(with_numa, member, tmp_path / "numa"))
        assert list(numa.needed) == want and numa.rpath is None and numa.runpath is None
        assert list(plain.needed) == [n for n in want if n != "libnuma.so.1"]


def test_read_dynamic_agrees_with_readelf(built: dict[str, list[Path]], tmp_path: Path) -> None:
    if shutil.which("readelf") is None:
        pytest.skip("binutils not installed")
    so = _extract(built["sgl"][0], "sgl_kernel/sm100/common_ops.abi3.so", tmp_path)
    out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True)
    assert list(read_dynamic(so).needed) == _fixture_needed(out.stdout)
    with pytest.raises(LabError, match="not a 64-bit"):
        read_dynamic(Path(__file__))


@pytest.mark.parametrize("lane", sw.LANES)
def test_nvidia_standins_paths_sonames_and_no_collision(
    built: dict[str, list[Path]], lane: str, tmp_path: Path
) -> None:
    with zipfile.ZipFile(_runtime_wheel(lane)) as zf:
        runtime_files = set(zf.namelist())
    seen: dict[str, str] = {}
    for wheel in [w for w in built[lane] if w.name.startswith("nvidia_")]:
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if ".dist-info/" in name:
                    continue
                assert name not in seen or name == "nvidia/__init__.py", (name, seen.get(name))
                seen[name] = wheel.name
                if "/lib/lib" in name:
                    assert (
                        read_dynamic(_extract(wheel, name, tmp_path)).soname == name.split("/")[-1]
                    )
    overlap = runtime_files & set(seen)
    assert overlap == (set() if lane == "cu130" else {"nvidia/__init__.py"})
    libdir = "nvidia/cu13/lib" if lane == "cu130" else "nvidia/cublas/lib"
    assert f"{libdir}/libcublas.so.{sw.lane_spec(lane).major}" in seen
    for lib in (
        "cudnn/lib/libcudnn.so.9",
        "nccl/lib/libnccl.so.2",
        "nvshmem/lib/libnvshmem_host.so.3",
    ):
        assert f"nvidia/{lib}" in seen


def test_libcuda_answers_like_a_driver(tmp_path: Path) -> None:
    for count, init_rc in ((2, 0), (0, 100)):
        lib = ctypes.CDLL(
            str(sw.build_libcuda(tmp_path / str(count) / "libcuda.so.1", device_count=count))
        )
        value = ctypes.c_int(-1)
        assert lib.cuDriverGetVersion(ctypes.byref(value)) == 0 and value.value == 13000
        assert lib.cuDeviceGetCount(ctypes.byref(value)) == 3  # not initialised yet
        assert lib.cuInit(0) == init_rc
        if init_rc == 0:
            assert lib.cuDeviceGetCount(ctypes.byref(value)) == 0 and value.value == count
    assert read_dynamic(tmp_path / "2" / "libcuda.so.1").soname == "libcuda.so.1"


def test_rebuild_is_byte_identical(built: dict[str, list[Path]], tmp_path: Path) -> None:
    again = _build_all(tmp_path)
    for group, wheels in built.items():
        for first, second in zip(wheels, again[group], strict=True):
            assert first.name == second.name and first.read_bytes() == second.read_bytes()


def test_bad_inputs_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="unknown CUDA lane 'cu121'"):
        sw.build_torch(tmp_path, "cu121", tmp_path / "x.whl")
    with pytest.raises(LabError, match="has no libcudart.so.12"):
        sw.build_torch(tmp_path, "cu128", _runtime_wheel("cu130"))
    with pytest.raises(LabError, match="cannot read the CUDA runtime wheel"):
        sw.build_torch(tmp_path, "cu130", tmp_path / "missing.whl")


# --- imports in real venvs ----------------------------------------------------------------


def _venv(root: Path, wheels: list[Path]) -> Path:
    subprocess.run([_python311(), "-m", "venv", str(root)], check=True, capture_output=True)
    py = root / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run(pip + [str(w) for w in wheels], check=True, capture_output=True)
    return py


def _run(py: Path, code: str, ld_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    if not LDSO.exists():
        pytest.skip("no x86-64 dynamic loader at /lib64")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    if ld_path is not None:
        env["LD_LIBRARY_PATH"] = str(ld_path)
    argv = [str(LDSO), "--inhibit-cache", str(py), "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def _pip_uninstall(py: Path, name: str) -> None:
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", name], check=True)


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_cu130_venv_imports_and_fails_for_real(
    built: dict[str, list[Path]], tmp_path: Path
) -> None:
    py = _venv(tmp_path / "venv", built["cu130"] + built["sgl"] + [_runtime_wheel("cu130")])
    drv = sw.build_libcuda(tmp_path / "drv" / "libcuda.so.1", device_count=2).parent
    ok = _run(py, "import torch, sgl_kernel, torchvision, triton; print(torch.__version__, "
                  "torch.version.cuda, torch._standin_cudart_version(), torch.cuda.device_count(), "
                  "sgl_kernel.__version__)", drv)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["2.11.0+cu130", "13.0", "13000", "2", "0.4.2"]
    no_driver = _run(py, "import sgl_kernel")
    assert no_driver.returncode != 0 and f"libcuda.so.1: {NOT_FOUND}" in no_driver.stderr
    _pip_uninstall(py, "nvidia-cuda-runtime")
    broken = _run(py, "import torch", drv)
    assert broken.returncode != 0
    assert f"OSError: libcudart.so.13: {NOT_FOUND}" in broken.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_cu128_venv_rejects_the_cuda13_kernel(built: dict[str, list[Path]], tmp_path: Path) -> None:
    py = _venv(tmp_path / "venv", built["cu128"] + built["sgl"] + [_runtime_wheel("cu128")])
    drv = sw.build_libcuda(tmp_path / "drv" / "libcuda.so.1", device_count=8).parent
    ok = _run(py, "import torch; print(torch.__version__, torch._standin_cudart_version())", drv)
    assert ok.returncode == 0 and ok.stdout.split() == ["2.11.0+cu128", "12080"], ok.stderr
    first = _run(py, "import sgl_kernel", drv)  # the real wheel's first CUDA 13 need is nvrtc
    assert "Could not load any common_ops" in first.stderr
    assert f"libnvrtc.so.13: {NOT_FOUND}" in first.stderr
    # with CUDA 13 nvrtc/cublas reachable (as in a mixed install), it is the runtime's turn
    cu13 = tmp_path / "cu13"
    cu13.mkdir()
    for wheel in built["cu130"]:
        if wheel.name.startswith(("nvidia_cublas", "nvidia_cuda_nvrtc")):
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    if "/lib/lib" in name:
                        (cu13 / name.split("/")[-1]).write_bytes(zf.read(name))
    shutil.copy(drv / "libcuda.so.1", cu13)
    second = _run(py, "import sgl_kernel", cu13)
    assert f"libcudart.so.13: {NOT_FOUND}" in second.stderr
    _pip_uninstall(py, "nvidia-cudnn-cu12")
    no_cudnn = _run(py, "import torch", drv)
    assert f"ImportError: libcudnn.so.9: {NOT_FOUND}" in no_cudnn.stderr
