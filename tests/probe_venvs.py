"""Build throwaway venv trees for the probe tests: dist-infos, torch/version.py, gcc-built
shared objects with chosen DT_NEEDED lists, and real sglang/flashinfer/xgrammar files copied
out of real registry wheels at test time (tests/wheels.toml: fetched by the test command before
the tiers, never stored in the repository)."""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

from wheelcache import wheel

from ddtree_lab.elfstub import SharedObject, compile_shared


def from_wheel(whl: Path, member: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(whl) as zf:
        dest.write_bytes(zf.read(member))


def dist_info(sp: Path, name: str, version: str, files: tuple[str, ...] = ()) -> None:
    folder = sp / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n"
    )
    rows = [f"{f},sha256=x,1" for f in files] + [f"{folder.name}/RECORD,,"]
    (folder / "RECORD").write_text("\n".join(rows) + "\n")


def shared_object(sp: Path, rel: str, needed: list[str], rpath: str | None = None) -> None:
    stem = rel.rsplit("/", 1)[-1].split(".")[0]
    macros = (("STANDIN_EXPORT", f"{stem}_label"), ("STANDIN_LABEL", '"probe test"'))
    spec = SharedObject("standin_lib.c", [*needed, "libc.so.6"], None, rpath, macros)
    compile_shared(spec, sp / rel)


def make_venv(root: Path, py: str = "3.11") -> tuple[Path, Path]:
    """An empty venv: pyvenv.cfg, bin/python -> this interpreter, lib/pythonX.Y/site-packages."""
    sp = root / "lib" / f"python{py}" / "site-packages"
    sp.mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion_info = {py}.7\n")
    return root, sp


def torch_cu130(sp: Path) -> None:
    dist_info(sp, "torch", "2.11.0", ("torch/version.py", "torch/lib/libtorch_cuda.so"))
    (sp / "torch").mkdir()
    (sp / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n"
    )
    needed = ["libcudart.so.13", "libcufft.so.12", "libcusparse.so.12", "libcublas.so.13",
              "libcudnn.so.9"]  # fmt: skip
    rpath = "$ORIGIN/../../nvidia/cudnn/lib:$ORIGIN/../../nvidia/cu13/lib:$ORIGIN"
    shared_object(sp, "torch/lib/libtorch_cuda.so", needed, rpath)
    shared_object(sp, "torch/lib/libc10.so", [])  # no CUDA: not listed
    for lib in ("cu13/lib/libcudart.so.13", "cudnn/lib/libcudnn.so.9"):
        path = sp / "nvidia" / lib
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def kernel_cu12(sp: Path) -> None:
    """A sglang-kernel built for CUDA 12 next to a CUDA 13 torch: the ABI mismatch to catch."""
    rel = "sgl_kernel/common_ops.abi3.so"
    dist_info(sp, "sglang-kernel", "0.4.1", (rel,))
    shared_object(sp, rel, ["libcudart.so.12", "libnvrtc.so.12", "libcuda.so.1"])


def broken_objects(sp: Path) -> None:
    (sp / "broken").mkdir()
    (sp / "broken" / "corrupt.so").write_bytes(b"\x7fELF\x02\x01\x01" + b"\xff" * 9 + b"\x00" * 20)
    (sp / "broken" / "old32.so").write_bytes(b"\x7fELF\x01\x01\x01" + b"\x00" * 60)
    (sp / "broken" / "notelf.so").write_text("INPUT(-lfoo)\n")  # a linker script


def sglang_tree(sp: Path, spec_text: str | None, ddtree: bool) -> None:
    """sglang with the real 0.5.11 spec_info.py (or `spec_text`), DFlash modules, and with
    `ddtree` a DDTree module and --speculative-ddtree-* flags."""
    whl = wheel("sglang", "0.5.11")
    dist_info(sp, "sglang", "0.5.11")
    spec_dir = sp / "sglang" / "srt" / "speculative"
    from_wheel(whl, "sglang/srt/speculative/spec_info.py", spec_dir / "spec_info.py")
    if spec_text is not None:
        (spec_dir / "spec_info.py").write_text(spec_text)
    for name in ("dflash_worker.py", "dflash_info.py", "dflash_utils.py", "eagle_worker.py"):
        (spec_dir / name).write_text("# stand-in\n")
    (sp / "sglang" / "__init__.py").write_text("raise RuntimeError('the probe imported sglang')\n")
    flags = '"--speculative-dflash-block-size"\n'
    if ddtree:
        (spec_dir / "ddtree_worker.py").write_text("# stand-in\n")
        flags += '"--speculative-ddtree-budget", "--speculative-ddtree-topk",\n'
    (sp / "sglang" / "srt" / "server_args.py").write_text(f"FLAGS = [\n{flags}]\n")


def real_spec_text() -> str:
    """sglang 0.5.11's spec_info.py, from the real wheel."""
    whl = wheel("sglang", "0.5.11")
    with zipfile.ZipFile(whl) as zf:
        return zf.read("sglang/srt/speculative/spec_info.py").decode()


def heavy_spec_text() -> str:
    """The real spec_info.py plus an import of sglang itself (as a later port might add)."""
    text = real_spec_text()
    head = "from __future__ import annotations\n"
    assert text.startswith(head)
    return head + "from sglang.srt.utils import is_cuda  # needs sglang\n" + text[len(head) :]


def ddtree_spec_text() -> str:
    """The real 0.5.11 spec_info.py, patched the way a DDTree port does it (our edit)."""
    text = real_spec_text()
    text = text.replace("    DFLASH = auto()\n", "    DFLASH = auto()\n    DDTREE = auto()\n", 1)
    old = "return self == SpeculativeAlgorithm.DFLASH\n"
    assert old in text
    new = "return self in (SpeculativeAlgorithm.DFLASH, SpeculativeAlgorithm.DDTREE)\n"
    return text.replace(old, new, 1)


def real_packages(sp: Path, flashinfer: str, xgrammar: str) -> None:
    """Every .py file of flashinfer and xgrammar, from the real wheels of these versions."""
    for name, version, package in (("flashinfer-python", flashinfer, "flashinfer"),
                                   ("xgrammar", xgrammar, "xgrammar")):
        whl = wheel(name, version)
        with zipfile.ZipFile(whl) as zf:
            for member in zf.namelist():
                if member.startswith(package + "/") and member.endswith(".py"):
                    from_wheel(whl, member, sp / member)


def have_gcc() -> bool:
    return shutil.which("gcc") is not None
