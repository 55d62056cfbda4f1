"""Issue 29, payload writes: the payload under concurrency, kills and hostile venvs.

Each case runs the real CLI on localhost in a subprocess (address space limited, a timeout) on
a real venv with a small sglang and a small payload (tests/payload_fakes.py):
* a venv whose bin/python starts another venv's python is refused (exit 2), neither written;
* a second command on a venv whose lock is held is refused at once, naming the holder;
* a failed install (a write past RLIMIT_FSIZE fails with EFBIG) leaves no state and the
  upstream files; a host script SIGKILLed mid-install (by an audit hook a `.pth` file of the
  venv installs: the moment it renames the worker's temporary) leaves a temporary and a half
  install: the next deploy removes the temporaries, undoes the half install and deploys; a
  planted `*.ddtree-tmp-*` beside a target is swept by rollback;
* verify compares every payload file with the sha256 recorded at deploy;
* a venv python that writes gigabytes to stdout ends in a clear error, bounded in memory.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from payload_fakes import fake_venv, package, payload_folder, site_packages, tree

from ddtree_deploy.payload.lock import VenvLock
from ddtree_deploy.transport.base import Capture
from ddtree_deploy.transport.local import LocalTransport

MEMORY = 3 << 30
TIMEOUT_S = 120
BIG = "WORKER = 2\n" + "# padding\n" * 20000  # 200 kB: the one payload file over the limit


KILLER = ("import os, sys; sys.addaudithook(lambda event, args: os.kill(os.getpid(), 9) "
          "if event == 'os.rename' and 'ddtree_worker.py.ddtree-tmp-' in str(args[0]) "
          "else None)\n")


def _limits(fsize: int | None = None) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return apply


def cli(root: Path, *args: str, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "xdg/cache"),
               XDG_STATE_HOME=str(root / "xdg/state"), XDG_CONFIG_HOME=str(root / "xdg/config"),
               NO_COLOR="1", COLUMNS="200")
    try:
        return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                               str(root / "hosts.yaml"), "payload", *args],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                              env=env, preexec_fn=_limits(fsize))
    except subprocess.TimeoutExpired:
        pytest.fail(f"payload {' '.join(args)} did not finish in {TIMEOUT_S} s")


@pytest.fixture()
def world(tmp_path: Path) -> tuple[Path, Path, Path]:
    (tmp_path / "hosts.yaml").write_text("version: 1\nhosts: {}\n")
    return tmp_path, fake_venv(tmp_path), payload_folder(tmp_path, worker=BIG)


def _deploy(root: Path, venv: Path, payload: Path, **kw: object
            ) -> subprocess.CompletedProcess[str]:
    return cli(root, "deploy", "localhost", "--venv", str(venv), "--payload", str(payload),
               **kw)  # type: ignore[arg-type]


def _temporaries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.ddtree-tmp-*"))


def test_a_venv_whose_python_is_another_venvs_is_refused(world: tuple[Path, Path, Path]
                                                         ) -> None:
    root, a, payload = world
    b = fake_venv(root, "other")
    python = a / "bin/python"
    python.unlink()
    python.write_text(f"#!/bin/sh\nexec {b}/bin/python \"$@\"\n")
    python.chmod(0o755)
    before_a, before_b = tree(a), tree(b)
    for command in ("deploy", "rollback", "verify"):
        extra = ["--payload", str(payload)] if command != "rollback" else []
        r = cli(root, command, "localhost", "--venv", str(a), *extra)
        said = r.stdout + r.stderr
        assert r.returncode == 2, said
        assert "is not its own" in said and str(b) in said, said
        assert "Traceback" not in said
    assert tree(a) == before_a and tree(b) == before_b


def test_a_second_command_on_a_locked_venv_is_refused(world: tuple[Path, Path, Path]) -> None:
    root, venv, payload = world
    before = tree(venv)
    with LocalTransport() as t, VenvLock(t, str(venv), []) as lock:
        assert lock.token.isdigit()
        for command in ("deploy", "rollback"):
            extra = ["--payload", str(payload)] if command == "deploy" else []
            r = cli(root, command, "localhost", "--venv", str(venv), *extra)
            said = r.stdout + r.stderr
            assert r.returncode == 2, said
            assert "holds the venv's lock" in said and f"pid {lock.token}" in said, said
        assert tree(venv) == before
    r = _deploy(root, venv, payload)  # released with the context
    assert r.returncode == 0, r.stdout + r.stderr


def test_two_deploys_at_once_never_leave_a_mix(world: tuple[Path, Path, Path],
                                               tmp_path: Path) -> None:
    """Two CLIs started together on one venv, twice over: each exits 0 (it deployed, or found
    it deployed) or 2 (refused: the venv's lock was held); the venv ends as one deploy leaves
    it, with one state and one backup."""
    root, venv, payload = world
    clean = fake_venv(tmp_path, "clean")
    assert _deploy(root, clean, payload).returncode == 0
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "xdg/cache"), NO_COLOR="1",
               XDG_STATE_HOME=str(root / "xdg/state"), XDG_CONFIG_HOME=str(root / "xdg/config"))
    argv = [sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(root / "hosts.yaml"),
            "payload", "deploy", "localhost", "--venv", str(venv), "--payload", str(payload)]
    for _ in range(2):
        procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert all(c in (0, 2) for c in codes) and 0 in codes, outs
        for p, (_out, err) in zip(procs, outs, strict=True):
            if p.returncode == 2:
                assert "holds the venv's lock" in err, err
        assert tree(package(venv)) == tree(package(clean))
        assert len(list((venv / ".ddtree-deploy/backups").iterdir())) == 1
        assert _temporaries(venv) == []


def test_a_failed_install_leaves_no_state_and_the_upstream_files(
        world: tuple[Path, Path, Path]) -> None:
    root, venv, payload = world
    before = tree(package(venv))
    r = _deploy(root, venv, payload, fsize=100_000)
    said = r.stdout + r.stderr
    assert r.returncode != 0, said
    assert "upstream files were put back" in said, said
    assert "Traceback" not in said
    assert not (venv / ".ddtree-deploy/payload.json").exists()
    assert not list((venv / ".ddtree-deploy/backups").iterdir())
    assert tree(package(venv)) == before
    assert _temporaries(venv) == []


def test_a_kill_mid_write_is_undone_and_its_temporaries_swept(
        world: tuple[Path, Path, Path], tmp_path: Path) -> None:
    root, venv, payload = world
    clean = fake_venv(tmp_path, "clean")
    assert _deploy(root, clean, payload).returncode == 0
    upstream = tree(package(venv))
    killer = site_packages(venv) / "zz_kill_mid_install.pth"
    killer.write_text(KILLER)
    r = _deploy(root, venv, payload)
    killer.unlink()
    assert r.returncode != 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert _temporaries(package(venv)), "the kill was expected mid-write"
    assert (venv / ".ddtree-deploy/pending.json").exists()
    assert tree(package(venv)) != upstream
    r = _deploy(root, venv, payload)
    said = r.stdout + r.stderr
    assert r.returncode == 0, said
    assert "install cut short was undone" in said and "temporary file" in said, said
    assert _temporaries(venv) == []
    assert tree(package(venv)) == tree(package(clean))
    assert not (venv / ".ddtree-deploy/pending.json").exists()
    r = cli(root, "rollback", "localhost", "--venv", str(venv))
    assert r.returncode == 0 and tree(package(venv)) == upstream


def test_rollback_sweeps_a_temporary_beside_a_target(world: tuple[Path, Path, Path]) -> None:
    root, venv, payload = world
    upstream = tree(package(venv))
    assert _deploy(root, venv, payload).returncode == 0
    left = package(venv) / "srt/speculative/spec_info.py.ddtree-tmp-4242"
    left.write_text("half a file")
    foreign = package(venv) / "srt/speculative/notes.txt.ddtree-tmp-1"  # not beside a target
    foreign.write_text("not ours")
    r = cli(root, "rollback", "localhost", "--venv", str(venv))
    assert r.returncode == 0, r.stdout + r.stderr
    assert not left.exists() and foreign.exists()
    foreign.unlink()
    assert tree(package(venv)) == upstream


def test_verify_compares_files_with_the_recorded_digests(world: tuple[Path, Path, Path]
                                                         ) -> None:
    root, venv, payload = world
    assert _deploy(root, venv, payload).returncode == 0
    ok = cli(root, "verify", "localhost", "--venv", str(venv), "--payload", str(payload))
    assert ok.returncode == 0 and "files match the sha256 recorded" in ok.stdout, ok.stdout
    (package(venv) / "srt/speculative/ddtree_extra.py").write_text("EXTRA = 2\n")
    r = cli(root, "verify", "localhost", "--venv", str(venv), "--payload", str(payload),
            "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["results"]["checks"]}
    assert checks["files"]["status"] == "failed"
    assert "srt/speculative/ddtree_extra.py" in checks["files"]["detail"]
    assert checks["spec_info"]["status"] == "passed"  # the manifest's own check cannot see it


def test_a_python_that_floods_stdout_ends_in_a_clear_error(world: tuple[Path, Path, Path]
                                                           ) -> None:
    root, venv, payload = world
    python = venv / "bin/python"
    python.unlink()
    python.write_text("#!/bin/sh\nhead -c 4000000000 /dev/zero\n")
    python.chmod(0o755)
    r = _deploy(root, venv, payload)
    said = r.stdout + r.stderr
    assert r.returncode == 2, said
    assert "did not answer the payload tool's JSON" in said, said
    assert "MemoryError" not in said and "Traceback" not in said


def test_capture_keeps_the_head_and_the_tail() -> None:
    cap = Capture(head=8, tail=4)
    for chunk in (b"0123", b"4567", b"89ab", b"cdef", b"\n{}\n"):
        cap.append(chunk)
    got = cap.value()
    assert got.startswith(b"01234567") and got.endswith(b"f\n{}\n"[-4:])
    assert b"[... 8 bytes of output dropped ...]" in got
    small = Capture(head=8, tail=4)
    small.append(b"abc")
    assert small.value() == b"abc"


@pytest.mark.parametrize("op", ["install", "plugin_stage"])
def test_a_write_without_the_lock_writes_nothing(world: tuple[Path, Path, Path], op: str) -> None:
    # The lock is checked before anything is written: a write op without it (or with a stale
    # token) is refused and leaves the venv as it was, not even its state folder created.
    from ddtree_deploy.payload.state import PayloadRefused, call
    from ddtree_deploy.transport.local import LocalTransport

    _root, venv, _payload = world
    before = tree(venv)
    req = {"package": "sglang", "state": {"package_dir": str(package(venv))}, "originals": {},
           "restore": [], "files": {}, "name": "x-1-py3-none-any.whl"}
    for lock in (None, "1"):
        with pytest.raises(PayloadRefused, match="lock"):
            call(LocalTransport(), str(venv), op, lock=lock, **req)
    assert tree(venv) == before
    assert not (venv / ".ddtree-deploy").exists()
