"""remote/overlay_tar_read.py: the overlay's tar reader gives what tarfile wrote, in any format."""

from __future__ import annotations

import io
import random
import tarfile

import pytest

from ddtree_deploy.remote.overlay_tar_read import TarReader


def _archive(fmt: int) -> tuple[bytes, list[tuple[str, bytes | None]]]:
    rng = random.Random(fmt)
    members: list[tuple[str, bytes | None]] = [
        ("a" * 64, rng.randbytes(3 * 1024 * 1024 + 17)),  # spans several chunks
        ("empty", b""),
        ("dir/", None),
        ("deep/" + "n" * 150 + ".so", rng.randbytes(1000)),  # a name past ustar's 100
        ("ünï", b"x" * 512),  # non-ASCII: a pax header in PAX_FORMAT
        ("link", None),
        ("end", b'{"missing": []}'),
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name.rstrip("/"))
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif name == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "a" * 64
                tar.addfile(info)
            else:
                assert data is not None
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), [(n.rstrip("/"), d) for n, d in members]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_members_and_contents_are_tarfiles_own(fmt: int) -> None:
    if fmt == tarfile.USTAR_FORMAT:  # ustar cannot hold the long or non-ASCII names
        data, want = _archive(tarfile.PAX_FORMAT)
    else:
        data, want = _archive(fmt)
    reader = TarReader(io.BufferedReader(io.BytesIO(data)), chunk=64 * 1024)
    got = []
    for member in reader:
        chunks = [bytes(v) for v in reader.content(member)]
        assert all(0 < len(c) <= 64 * 1024 for c in chunks)  # bounded reads, none empty
        content = b"".join(chunks)
        got.append((member.name, content if member.isfile() else None))
    assert got == want


def test_a_member_left_unread_is_skipped() -> None:
    data, want = _archive(tarfile.PAX_FORMAT)
    names = [m.name for m in TarReader(io.BytesIO(data))]
    assert names == [n for n, _ in want]
    reader = TarReader(io.BytesIO(data), chunk=4096)
    first = reader.next()
    assert first is not None
    next(iter(reader.content(first)))  # one chunk of the big member, then on
    rest = [(m.name, b"".join(bytes(v) for v in reader.content(m))) for m in reader]
    assert rest[-1] == ("end", b'{"missing": []}') and len(rest) == len(want) - 1


def test_views_share_one_buffer() -> None:
    data, _ = _archive(tarfile.GNU_FORMAT)
    reader = TarReader(io.BytesIO(data), chunk=8192)
    member = reader.next()
    assert member is not None
    views = reader.content(member)
    a, b = next(views), next(views)
    assert a.obj is b.obj  # no new buffer per read


def test_a_stream_cut_inside_a_member_is_an_error_and_between_members_an_end() -> None:
    data, _ = _archive(tarfile.PAX_FORMAT)
    reader = TarReader(io.BytesIO(data[:512 + 100_000]))
    member = reader.next()
    assert member is not None
    with pytest.raises(EOFError):
        for _ in reader.content(member):
            pass
    one = io.BytesIO()
    with tarfile.open(fileobj=one, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("x")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    cut = one.getvalue()[:1024]  # the member whole, no end-of-archive blocks
    assert [m.name for m in TarReader(io.BytesIO(cut))] == ["x"]


def test_a_damaged_header_is_refused() -> None:
    data, _ = _archive(tarfile.GNU_FORMAT)
    broken = bytearray(data)
    broken[148:156] = b"0000000\0"  # the checksum field
    with pytest.raises(tarfile.TarError):
        TarReader(io.BytesIO(bytes(broken))).next()
