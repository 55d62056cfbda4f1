"""The probe's ELF reader on gcc-built shared objects, and its errors on bad files."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from probe_venvs import shared_object

from ddtree_deploy.remote.facts_elf import ElfError, elf_dynamic
from ddtree_lab.elfstub import read_dynamic

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


@needs_gcc
def test_needed_and_rpath_of_a_built_object(tmp_path: Path) -> None:
    needed = ["libnvrtc.so.13", "libcudart.so.13", "libcublasLt.so.13"]
    shared_object(tmp_path, "a/ops.abi3.so", needed, "$ORIGIN/../nvidia/cu13/lib:$ORIGIN")
    got = elf_dynamic(str(tmp_path / "a/ops.abi3.so"))
    assert got["needed"] == [*needed, "libc.so.6"]
    assert got["rpath"] == ["$ORIGIN/../nvidia/cu13/lib", "$ORIGIN"]
    assert got["runpath"] == []
    # the lab's adapter (used by the stand-in wheel tests) gives the same view
    lab = read_dynamic(tmp_path / "a/ops.abi3.so")
    assert tuple(got["needed"]) == lab.needed
    assert ":".join(got["rpath"]) == lab.rpath


@needs_gcc
def test_reads_only_pages_it_needs(tmp_path: Path) -> None:
    """A 64 MiB sparse tail after the object does not slow the reader down or confuse it."""
    shared_object(tmp_path, "big.so", ["libcudart.so.12"])
    with open(tmp_path / "big.so", "ab") as fh:
        fh.truncate(64 << 20)
    assert elf_dynamic(str(tmp_path / "big.so"))["needed"] == ["libcudart.so.12", "libc.so.6"]


def _elf64_header(phoff: int, phnum: int, phentsize: int = 56) -> bytes:
    head = bytearray(64)
    head[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<Q", head, 0x20, phoff)
    struct.pack_into("<HH", head, 0x36, phentsize, phnum)
    return bytes(head)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not an ELF file"),
        (b"INPUT(-lfoo)\n", "not an ELF file"),
        (b"\x7fELF\x01\x01\x01" + b"\0" * 60, "32-bit"),
        (b"\x7fELF\x02\x02\x01" + b"\0" * 60, "big-endian"),
        (b"\x7fELF\x02\x01", "not an ELF file"),
        (b"\x7fELF\x02\x01\x01" + b"\0" * 20, "truncated ELF header"),
        (_elf64_header(64, 3), "truncated file"),
        (_elf64_header(64, 3, phentsize=8), "bad program header table"),
    ],
)
def test_bad_files_give_an_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.so"
    path.write_bytes(content)
    with pytest.raises(ElfError, match=message):
        elf_dynamic(str(path))


def test_missing_file_is_an_elf_error(tmp_path: Path) -> None:
    with pytest.raises(ElfError, match="cannot read"):
        elf_dynamic(str(tmp_path / "absent.so"))


def test_static_object_has_no_needs(tmp_path: Path) -> None:
    path = tmp_path / "static.so"
    path.write_bytes(_elf64_header(0, 0))
    assert elf_dynamic(str(path)) == {"needed": [], "soname": None, "rpath": [], "runpath": []}
