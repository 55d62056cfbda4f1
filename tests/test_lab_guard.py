"""The lab's lock (one user at a time, the holder named) and deletion that never crosses a mount.

These tests never touch the lab itself: the lock is a file of the test's own (DDTREE_LAB_LOCK
or the path argument), and the mounts are tmpfs mounts made in the test's temporary folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree_lab import container, fsguard, lock

HOLDER = """
import sys
from pathlib import Path
from ddtree_lab import lock
with lock.hold(0, path=Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


class Held:
    def __init__(self, path: Path, marker: str) -> None:
        script = path.with_name("holder.py")
        script.write_text(HOLDER)
        self.proc = subprocess.Popen([sys.executable, str(script), str(path), marker],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "held\n"

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture()
def held(tmp_path: Path) -> Iterator[tuple[Path, Held]]:
    path = tmp_path / "lab.lock"
    h = Held(path, "marker-of-the-holder")
    try:
        yield path, h
    finally:
        if h.proc.poll() is None:
            h.release()


def test_second_caller_is_refused_naming_the_holder(held: tuple[Path, Held]) -> None:
    path, h = held
    with pytest.raises(lock.LabBusyError) as info, lock.hold(0, path=path):
        pass
    assert f"PID {h.proc.pid}" in info.value.message
    assert "marker-of-the-holder" in info.value.message  # its command line
    assert "--wait" in str(info.value)


def test_second_caller_waits_until_the_holder_is_done(held: tuple[Path, Held]) -> None:
    path, h = held
    told: list[str] = []

    def waiting(who: str) -> None:
        told.append(who)
        h.release()  # the holder finishes while we wait

    with lock.hold(600, path=path, waiting=waiting) as me:
        assert me.pid == os.getpid()
        assert lock.read_holder(path) == me
    assert len(told) == 1 and f"PID {h.proc.pid}" in told[0]
    assert lock.read_holder(path) is None  # released: nobody recorded


def test_holder_and_its_children_go_on_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "lab.lock"
    with lock.hold(0, path=path) as outer:
        with lock.hold(0, path=path) as inner:  # a test calling manager.up() in the session
            assert inner == outer
        child = subprocess.run([sys.executable, "-c", HOLDER, str(path)], input="",
                               capture_output=True, text=True, timeout=60)
        assert child.returncode == 0 and child.stdout == "held\n", child.stderr
        assert lock.read_holder(path) == outer  # the nested holds did not release it
    assert lock.read_holder(path) is None


def test_lab_lock_is_not_the_session_wrapper_lock() -> None:
    # People wrap whole sessions in `flock /tmp/ddtree-lab-session.lock ...`; the lab's own
    # lock must be another file, or the wrapped session would wait on itself.
    assert lock.DEFAULT_PATH.resolve() != Path("/tmp/ddtree-lab-session.lock").resolve()


@pytest.mark.skipif(os.geteuid() != 0, reason="lab up/down need root")
def test_cli_lab_up_refused_while_held(held: tuple[Path, Held], tmp_path: Path) -> None:
    path, h = held
    env = {**os.environ, lock.ENV_PATH: str(path), "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    cli = str(Path(sys.executable).with_name("ddtree-deploy"))
    r = subprocess.run([cli, "lab", "up"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"PID {h.proc.pid}" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "cache").exists()


# -- no deleting across a mount point ------------------------------------------------------------

def test_mountinfo_escapes_are_read(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(f"36 35 98:0 / {tmp_path}/with\\040space rw - ext4 /dev/x rw\n"
                    f"37 35 98:0 / /elsewhere rw - ext4 /dev/x rw\n")
    assert fsguard.mounts_under(tmp_path, str(info)) == [tmp_path / "with space"]
    assert fsguard.mounts_under(tmp_path / "with", str(info)) == []  # a prefix is not a parent


@pytest.fixture()
def mounted(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    point = tmp_path / "run" / "host" / "root"
    point.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)], check=True)
    (point / "etc").mkdir()
    (point / "etc" / "keep").write_text("a live container's file\n")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False)


def test_remove_tree_refuses_through_a_mount(mounted: Path, tmp_path: Path) -> None:
    with pytest.raises(fsguard.MountedError) as info:
        fsguard.remove_tree(tmp_path / "run")
    assert str(mounted) in info.value.message
    with pytest.raises(fsguard.MountedError):
        container.reset_dir(tmp_path / "run" / "host")  # what `lab up` once did
    assert (mounted / "etc" / "keep").read_text() == "a live container's file\n"
    subprocess.run(["umount", str(mounted)], check=True)
    fsguard.remove_tree(tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_remove_tree_checks_devices_too(mounted: Path, tmp_path: Path) -> None:
    # A mount this process cannot see in its mountinfo (another namespace's view, a race):
    # the folder on another device is still found before anything is deleted.
    empty = tmp_path / "no-mounts"
    empty.write_text("")
    with pytest.raises(fsguard.MountedError):
        fsguard.remove_tree(tmp_path / "run", str(empty))
    assert (mounted / "etc" / "keep").exists()


def test_remove_tree_deletes_plain_trees_and_files(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("x")
    os.symlink("/etc", tmp_path / "a" / "link-out")  # a link is removed, never followed
    fsguard.remove_tree(tmp_path / "a")
    assert not (tmp_path / "a").exists() and Path("/etc/hostname").exists()
    fsguard.remove_tree(tmp_path / "absent")  # nothing there: nothing to do
    (tmp_path / "file").write_text("x")
    fsguard.remove_tree(tmp_path / "file")
    assert not (tmp_path / "file").exists()
