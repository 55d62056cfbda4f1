"""A small ELF64 reader for the probe: DT_NEEDED, DT_SONAME, DT_RPATH/RUNPATH only.

Reads the header, the program headers, the dynamic segment and the few strings it names,
each with seek + a bounded read, so a 1 GB libtorch_cuda.so costs a few KB of I/O.
Part of the probe bundle (remote/bundle.py): stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from typing import Any, BinaryIO

ELF_MAX_PHNUM = 4096
ELF_MAX_DYN = 1 << 20  # bytes of dynamic segment read at most
ELF_MAX_STR = 4096  # one string (a long RPATH) read at most

_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 14, 15, 29
_PT_LOAD, _PT_DYNAMIC = 1, 2


def open_regular(path: str) -> BinaryIO:
    """`path` opened for reading if it is a regular file, without waiting on a FIFO (OSError
    otherwise): the probe's one way to open a file it reads."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise OSError(errno.EINVAL, "not a regular file")
    return fh


class ElfError(Exception):
    """The file is not an ELF64 little-endian object we can read."""


def _read_at(fh: BinaryIO, offset: int, size: int) -> bytes:
    fh.seek(offset)
    data = fh.read(size)
    if len(data) != size:
        raise ElfError(f"truncated file (wanted {size} bytes at offset {offset})")
    return data


def _read_cstr(fh: BinaryIO, offset: int) -> str:
    fh.seek(offset)
    data = fh.read(ELF_MAX_STR)
    end = data.find(b"\0")
    if end < 0:
        raise ElfError(f"unterminated string at offset {offset}")
    return data[:end].decode("utf-8", "replace")


def elf_dynamic_fh(fh: BinaryIO) -> dict[str, Any]:
    """{"needed": [...], "soname": str|None, "rpath": [...], "runpath": [...]} of an open file."""
    ident = fh.read(64)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if ident[4] != 2:
        raise ElfError("32-bit ELF is not supported")
    if ident[5] != 1:
        raise ElfError("big-endian ELF is not supported")
    if len(ident) < 64:
        raise ElfError("truncated ELF header")
    phoff = struct.unpack_from("<Q", ident, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", ident, 0x36)
    if phnum == 0:
        return {"needed": [], "soname": None, "rpath": [], "runpath": []}
    if phentsize < 56 or phnum > ELF_MAX_PHNUM:
        raise ElfError(f"bad program header table ({phnum} entries of {phentsize} bytes)")
    table = _read_at(fh, phoff, phentsize * phnum)
    loads: list[tuple[int, int, int]] = []
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", table, i * phentsize
        )
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:  # a static object
        return {"needed": [], "soname": None, "rpath": [], "runpath": []}
    dyn = _read_at(fh, dynamic[0], min(dynamic[1], ELF_MAX_DYN) // 16 * 16)
    entries: list[tuple[int, int]] = []
    for pos in range(0, len(dyn), 16):
        tag, value = struct.unpack_from("<qQ", dyn, pos)
        if tag == _DT_NULL:
            break
        entries.append((tag, value))
    strtab_vaddr = next((v for t, v in entries if t == _DT_STRTAB), None)
    if strtab_vaddr is None:
        raise ElfError("dynamic section without a string table")
    strtab = next(
        (off + strtab_vaddr - va for va, off, size in loads if va <= strtab_vaddr < va + size),
        None,
    )
    if strtab is None:
        raise ElfError(f"string table address {strtab_vaddr:#x} is outside every segment")

    def strings(tag: int) -> list[str]:
        return [_read_cstr(fh, strtab + v) for t, v in entries if t == tag]

    soname = strings(_DT_SONAME)

    def paths(tag: int) -> list[str]:
        return [p for s in strings(tag) for p in s.split(":") if p]

    return {
        "needed": strings(_DT_NEEDED),
        "soname": soname[0] if soname else None,
        "rpath": paths(_DT_RPATH),
        "runpath": paths(_DT_RUNPATH),
    }


def elf_dynamic(path: str) -> dict[str, Any]:
    """elf_dynamic_fh of a path; ElfError (also for I/O errors) when it cannot be read."""
    try:  # a regular file only: a FIFO named *.so would hold the probe
        with open_regular(path) as fh:
            return elf_dynamic_fh(fh)
    except OSError as exc:
        raise ElfError(f"cannot read: {exc.strerror or exc}") from exc
    except struct.error as exc:
        raise ElfError(f"malformed ELF: {exc}") from exc
