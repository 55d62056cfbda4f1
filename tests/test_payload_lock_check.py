"""The payload's write ops check the venv's lock (remote/payload_venv.py, Venv.check_lock).

In process: the venv is this test's own (the write ops require sys.prefix to be the venv), and
the lock is an flock this process takes on the folder, as the host's `hold` op does. A write
goes through only when the lock is provably held by the holder whose token it carries; where
the kernel's lock list cannot name the holder (a host whose /proc/locks is unreadable, played
by pointing the module at a missing file) it is refused, with what to check and how a stale
lock is cleared, unless the token's process has the folder open.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree_deploy.remote import payload_venv
from ddtree_deploy.remote.payload_fs import Refused


@pytest.fixture()
def held() -> Iterator[payload_venv.Venv]:
    venv = payload_venv.Venv("pip", sys.prefix)
    fd = venv.take_lock()
    assert fd is not None, "the test venv's lock is held elsewhere"
    try:
        yield venv
    finally:
        os.close(fd)


def test_the_holder_named_by_the_kernel_passes_and_another_is_refused(
        held: payload_venv.Venv) -> None:
    held.check_lock(str(os.getpid()))
    with pytest.raises(Refused, match=r"held by another command \(pid \d+"):
        held.check_lock(str(os.getpid() + 1))


def test_an_unidentified_holder_is_refused_with_what_to_check(
        held: payload_venv.Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(payload_venv, "PROC_LOCKS", str(tmp_path / "no-locks"))
    assert held.holder_text() == payload_venv.UNKNOWN_HOLDER
    with pytest.raises(Refused) as info:
        held.check_lock("1")  # a live process that does not have the venv open
    message = str(info.value)
    assert f"the venv's lock on {held.prefix} is held, and its holder cannot be identified" \
        in message
    assert f"`fuser -v {held.prefix}`" in message and "ending that process" in message
    # the token's process has the folder open (the hold's descriptor): provably its lock
    held.check_lock(str(os.getpid()))


def test_a_lock_nobody_holds_is_refused(tmp_path: Path) -> None:
    venv = payload_venv.Venv("pip", sys.prefix)
    with pytest.raises(Refused, match="not held"):
        venv.check_lock(str(os.getpid()))
    fd = os.open(venv.prefix, os.O_RDONLY)
    try:  # a shared lock (a reader) is no writer's lock
        fcntl.flock(fd, fcntl.LOCK_SH)
        with pytest.raises(Refused, match="not held"):
            venv.check_lock(str(os.getpid()))
    finally:
        os.close(fd)
