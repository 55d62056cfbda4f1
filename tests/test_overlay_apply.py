"""overlay apply on scratch venvs: swap, idempotence, byte-exact rollback, failed checks,
free space, and SIGKILL at random points (the site-packages is always old or new, whole).

The lane is built here: dist-infos with real RECORDs (sha256, sizes), gcc-built shared
objects whose DT_NEEDED names libcudart.so.12 or .13, a bin/ script, and an nvidia
namespace __init__.py shared with a distribution outside the lane. The target script is
the real bundle (overlay/apply.py's script_source) run with the venv's python.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from ddtree_deploy.errors import DeployError, RefusedError
from ddtree_deploy.overlay import apply as overlay_apply
from ddtree_deploy.overlay.lanefile import LaneChecks
from ddtree_deploy.overlay.model import (
    DistChange,
    DistManifest,
    Endpoint,
    FileEntry,
    OverlayPlan,
    manifests_id,
)
from ddtree_deploy.transport.local import LocalTransport
from ddtree_lab.elfstub import SharedObject, compile_shared

PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
CHECKS = {"torch_cuda": "13.0", "extension_cudart_major": 13, "imports": ["torch"],
          "timeout": 60}
Files = dict[str, bytes]


# -- building the lane ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("script") / "apply_remote.py"
    path.write_text(overlay_apply.script_source())
    return path


@pytest.fixture(scope="session")
def elves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build shared objects")
    out: dict[str, bytes] = {}
    folder = tmp_path_factory.mktemp("elf")
    for key, needed in (("cu12", "libcudart.so.12"), ("cu13", "libcudart.so.13")):
        macros = (("STANDIN_EXPORT", f"x_{key}"), ("STANDIN_LABEL", f'"{key}"'))
        spec = SharedObject("standin_lib.c", [needed, "libc.so.6"], None, None, macros)
        out[key] = compile_shared(spec, folder / f"lib{key}.so").read_bytes()
    return out


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_dist(name: str, version: str, files: Files) -> tuple[DistManifest, Files]:
    """A distribution as a wheel installs it: the files, METADATA, INSTALLER and RECORD."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    files = dict(files)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/METADATA"] = meta.encode()
    files[f"{info}/INSTALLER"] = b"pip\n"
    rows = [f"{p},sha256={_b64(d)},{len(d)}" for p, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(rows) + "\n").encode()
    entries = [FileEntry(path=p, sha256=hashlib.sha256(d).hexdigest(), size=len(d))
               for p, d in files.items()]
    return DistManifest(name=name, version=version, dist_info=info, files=entries), files


def lane_versions(elves: dict[str, bytes], n: int = 60, *, cuda: str = "13.0",
                  lib: str = "cu13", torch_init: bytes = b"ok = True\n") -> dict[str, Any]:
    """The old (cu128) and new (cu130) lane, with overlapping, changed and dropped files."""
    common = {f"torch/include/h{i}.h": f"header {i}\n".encode() * 50 for i in range(n)}
    old_torch = {**common, "torch/__init__.py": b"ok = True\n",
                 "torch/version.py": b"__version__ = '2.11.0+cu128'\ncuda = '12.8'\n",
                 "torch/lib/libc10_cuda.so": elves["cu12"], "torch/lib/libold_only.so": b"x" * 99,
                 "../../../bin/torchrun": b"#!/bin/sh\necho old\n"}
    old_torch.update({f"torch/ops/op{i}.py": f"op = {i}\n".encode() for i in range(n)})
    new_torch = {**common, "torch/__init__.py": torch_init,
                 "torch/version.py": f"__version__ = '2.11.0+cu130'\ncuda = '{cuda}'\n".encode(),
                 "torch/lib/libc10_cuda.so": elves[lib], "torch/lib/libtorch_cuda.so": elves[lib],
                 "../../../bin/torchrun": b"#!/bin/sh\necho new\n"}
    new_torch.update({f"torch/ops/op{i}.py": f"op = {i * 2}\n".encode() for i in range(n)})
    shared = {"nvidia/__init__.py": b""}
    old = by_name([
        make_dist("torch", "2.11.0+cu128", old_torch),
        make_dist("nvidia-cuda-runtime-cu12", "12.8.90",
                  {**shared, "nvidia/cuda_runtime/lib/libcudart.so.12": b"cudart12" * 200}),
        make_dist("nvidia-cublas-cu12", "12.8.4.1",
                  {**shared, "nvidia/cublas/lib/libcublas.so.12": b"cublas12" * 300}),
    ])
    new = by_name([
        make_dist("torch", "2.11.0+cu130", new_torch),
        make_dist("nvidia-cuda-runtime", "13.0.96",
                  {"nvidia/cu13/lib/libcudart.so.13": b"cudart13" * 200}),
    ])
    # outside the lane: shares nvidia/__init__.py, must keep it
    other = make_dist("nvidia-nccl-cu12", "2.27.3", {**shared, "nvidia/nccl/lib/x.so.2": b"n"})
    return {"old": old, "new": new, "other": other}


def by_name(dists: list[tuple[DistManifest, Files]]) -> dict[str, tuple[DistManifest, Files]]:
    return {d.name: (d, f) for d, f in dists}


def make_venv(root: Path) -> tuple[Path, Path]:
    site = root / "lib" / PY / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    return root, site


def install(site: Path, files: Files) -> None:
    for rel, data in files.items():
        path = Path(os.path.normpath(site / rel))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if rel.startswith("../../../bin/") or ".so" in rel:
            path.chmod(0o755)


def make_plan(venv: Path, old: dict[str, DistManifest], new: dict[str, DistManifest]
              ) -> OverlayPlan:
    changes = []
    for name, nd in new.items():
        od = old.get(name)
        have = od.by_path() if od else {}
        keep = [f for f in nd.files if f.path in have and have[f.path].sha256 == f.sha256]
        send = [f for f in nd.files if f not in keep]
        new_paths = {f.path for f in nd.files}
        action: Literal["add", "same", "replace"] = "replace"
        if od is None:
            action = "add"
        elif not send and len(have) == len(keep):
            action = "same"
        changes.append(DistChange(
            name=name, old_version=od.version if od else None, new_version=nd.version,
            action=action, send=send, keep=keep,
            delete=[p for p in have if p not in new_paths], backup=list(have)))
    for name, od in old.items():
        if name not in new:
            paths = [f.path for f in od.files]
            changes.append(DistChange(name=name, old_version=od.version, action="remove",
                                      delete=paths, backup=paths))
    return OverlayPlan(lane="cu130", source=Endpoint(host="ct129", venv="/root/ml-env"),
                       target=Endpoint(host="localhost", venv=str(venv)), changes=changes,
                       id=manifests_id(list(new.values())))


def stage(venv: Path, plan: OverlayPlan, contents: dict[str, bytes]) -> None:
    blobs = Path(overlay_apply.staging_dir(str(venv), plan.id)) / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    for change in plan.changes:
        for f in change.send:
            (blobs / f.sha256).write_bytes(contents[f.sha256])


@dataclass
class Scene:
    script: Path
    venv: Path
    site: Path
    plan: OverlayPlan
    request: Path
    old: dict[str, str]  # venv-relative path -> sha256, the whole old lane
    new: dict[str, str]
    outside: set[str]  # paths owned by the distribution outside the lane


def scene(script: Path, root: Path, lane: dict[str, Any], checks: dict[str, Any] | None = None,
          **options: Any) -> Scene:
    venv, site = make_venv(root / "venv")
    for _dist, files in [*lane["old"].values(), lane["other"]]:
        install(site, files)
    old = {n: d for n, (d, _f) in lane["old"].items()}
    new = {n: d for n, (d, _f) in lane["new"].items()}
    plan = make_plan(venv, old, new)
    contents = {hashlib.sha256(d).hexdigest(): d for _m, fs in lane["new"].values()
                for d in fs.values()}
    stage(venv, plan, contents)
    req = {"plan": plan.model_dump(mode="json"), "checks": CHECKS if checks is None else checks,
           **options}
    request = root / "request.json"
    request.write_text(json.dumps(req))

    def rel(d: DistManifest) -> dict[str, str]:
        return {os.path.relpath(os.path.normpath(site / f.path), venv): f.sha256
                for f in d.files}

    return Scene(script, venv, site, plan, request,
                 {k: v for d in old.values() for k, v in rel(d).items()},
                 {k: v for d in new.values() for k, v in rel(d).items()},
                 set(rel(lane["other"][0])))


def run(sc: Scene, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run([str(sc.venv / "bin" / "python"), str(sc.script), "--venv", str(sc.venv),
                           *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else {"stderr": proc.stderr})


def snapshot(venv: Path) -> dict[str, tuple[str, int]]:
    """Every file, link and folder of the venv (outside the overlay's own state)."""
    out: dict[str, tuple[str, int]] = {}
    for dirpath, dirs, files in os.walk(venv):
        dirs[:] = [d for d in dirs if d != ".ddtree-deploy"]
        for name in dirs + files:
            path = Path(dirpath) / name
            rel = str(path.relative_to(venv))
            st = path.lstat()
            if path.is_symlink():
                out[rel] = ("link:" + os.readlink(path), 0)
            elif path.is_dir():
                out[rel] = ("dir", 0)
            else:
                out[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mode & 0o777)
    return out


def lane_state(sc: Scene) -> str:
    """'old' or 'new' when every file of the lane matches that side whole, else 'mixed'."""

    def matches(want: dict[str, str], other: dict[str, str]) -> bool:
        for rel, sha in want.items():
            path = sc.venv / rel
            if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha:
                return False
        stray = set(other) - set(want) - sc.outside
        return not any(os.path.lexists(sc.venv / rel) for rel in stray)

    if matches(sc.old, sc.new):
        return "old"
    return "new" if matches(sc.new, sc.old) else "mixed"


# -- behaviour -----------------------------------------------------------------------------


def test_apply_reapply_and_byte_exact_rollback(script: Path, tmp_path: Path,
        elves: dict[str, bytes]) -> None:
    sc = scene(script, tmp_path, lane_versions(elves))
    before = snapshot(sc.venv)
    code, out = run(sc, "apply", str(sc.request), "--token", "t1")
    assert code == 0, out
    assert out["result"] == "applied"
    assert {c["check"]: c["ok"] for c in out["checks"]} == {
        "torch_cuda": True, "extension_cudart_major": True, "import torch": True}
    assert lane_state(sc) == "new"
    assert os.access(sc.venv / "bin" / "torchrun", os.X_OK)
    assert (sc.site / "nvidia" / "__init__.py").exists()  # nccl (outside the lane) owns it
    assert not (sc.site / "nvidia" / "cublas").exists()  # emptied folders are pruned
    assert not (sc.site / "torch-2.11.0+cu128.dist-info").exists()
    assert not Path(overlay_apply.staging_dir(str(sc.venv), sc.plan.id)).exists()
    assert not list(sc.venv.rglob("*.ddtree-new"))
    after = snapshot(sc.venv)

    code, again = run(sc, "apply", str(sc.request))  # the same plan twice: nothing changes
    assert (code, again["result"]) == (0, "unchanged")
    assert snapshot(sc.venv) == after
    lane = lane_versions(elves)  # a fresh plan made from the new state: every dist "same"
    new = {n: d for n, (d, _f) in lane["new"].items()}
    replan = make_plan(sc.venv, new, new)
    assert {c.action for c in replan.changes} == {"same"}
    sc.request.write_text(json.dumps({"plan": replan.model_dump(mode="json"), "checks": CHECKS}))
    code, again = run(sc, "apply", str(sc.request))
    assert (code, again["result"]) == (0, "unchanged")
    assert snapshot(sc.venv) == after

    code, back = run(sc, "rollback")
    assert (code, back["result"]) == (0, "rolled-back"), back
    assert snapshot(sc.venv) == before  # byte-exact, modes and folders included
    code, none = run(sc, "rollback")
    assert code == 1 and "nothing to roll back" in none["message"]
    code, hist = run(sc, "history")
    assert [(h["op"], h["result"]) for h in hist["history"]] == [
        ("apply", "applied"), ("apply", "unchanged"), ("apply", "unchanged"),
        ("rollback", "rolled-back")]
    assert hist["history"][0]["plan_id"] == sc.plan.id


@pytest.mark.parametrize(("variant", "needle"), [
    ({"cuda": "12.8"}, "torch_cuda: torch.version.cuda is '12.8', expected '13.0'"),
    ({"lib": "cu12"}, "torch/lib/libc10_cuda.so needs libcudart.so.12"),
    ({"torch_init": b"raise ImportError('libcudart.so.13: cannot open')\n"},
     "import torch: exit 1: ImportError: libcudart.so.13: cannot open"),
])
def test_failed_check_rolls_back(script: Path, tmp_path: Path, elves: dict[str, bytes],
                                 variant: dict[str, Any], needle: str) -> None:
    sc = scene(script, tmp_path, lane_versions(elves, **variant))
    before = snapshot(sc.venv)
    code, out = run(sc, "apply", str(sc.request))
    assert (code, out["result"]) == (1, "rolled-back"), out
    assert needle in out["message"]
    assert snapshot(sc.venv) == before
    blobs = Path(overlay_apply.staging_dir(str(sc.venv), sc.plan.id)) / "blobs"
    assert {f.sha256 for c in sc.plan.changes for f in c.send} == {p.name for p in
                                                                   blobs.iterdir()}
    _code, hist = run(sc, "history")
    assert hist["history"][-1]["result"] == "rolled-back"


def test_a_backup_folder_left_by_a_killed_run_is_not_reused(script: Path, tmp_path: Path,
                                                            elves: dict[str, bytes]) -> None:
    """A run killed after making its backup folder but before its journal named it leaves
    that folder behind; a retry within the same second makes a folder of its own."""
    sc = scene(script, tmp_path, lane_versions(elves))
    backups = sc.venv / ".ddtree-deploy" / "overlay" / "backups"
    start = time.time()
    for dt in range(4):  # the names this second and the next few can take
        stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(start + dt))
        (backups / f"{stamp}-{sc.plan.lane}-{sc.plan.id[:8]}" / "files").mkdir(parents=True)
    code, out = run(sc, "apply", str(sc.request))
    assert (code, out["result"]) == (0, "applied"), out
    assert out["backup"].endswith(".2") and lane_state(sc) == "new"
    assert [p.name for p in backups.iterdir()] == [out["backup"]]  # the leftovers pruned


def test_corrupt_staging_refused_before_touching(script: Path, tmp_path: Path,
        elves: dict[str, bytes]) -> None:
    sc = scene(script, tmp_path, lane_versions(elves))
    before = snapshot(sc.venv)
    blob = next((Path(overlay_apply.staging_dir(str(sc.venv), sc.plan.id)) / "blobs").iterdir())
    blob.write_bytes(b"Z" * blob.stat().st_size)
    code, out = run(sc, "apply", str(sc.request))
    assert code == 1 and "does not match its sha256" in out["message"]
    assert snapshot(sc.venv) == before
    assert not (sc.venv / ".ddtree-deploy" / "overlay" / "journal.json").exists()


def test_too_little_free_space_reported_before_swap(script: Path, tmp_path: Path,
                                                    elves: dict[str, bytes]) -> None:
    st = os.statvfs(tmp_path)
    sc = scene(script, tmp_path, lane_versions(elves), reserve=st.f_bavail * st.f_frsize * 2)
    before = snapshot(sc.venv)
    code, out = run(sc, "apply", str(sc.request))
    assert (code, out["result"]) == (5, "no-space"), out
    assert "not enough free space" in out["message"] and "nothing was changed" in out["message"]
    assert snapshot(sc.venv) == before
    assert not os.listdir(sc.venv / ".ddtree-deploy" / "overlay" / "backups")


def test_full_tmpfs_reported_before_swap(script: Path, tmp_path: Path,
        elves: dict[str, bytes]) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs",
                                            str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        sc = scene(script, mnt / "venv", lane_versions(elves), reserve=1 << 20)
        before = snapshot(sc.venv)
        run(sc, "status")  # the overlay's folders exist
        st = os.statvfs(mnt)
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)  # the disk fills up
        try:  # first to less than the reserve, then to the last byte
            os.write(fd, b"\0" * (st.f_bavail * st.f_frsize - (256 << 10)))
            code, out = run(sc, "apply", str(sc.request))
            assert (code, out["result"]) == (5, "no-space"), out
            assert "the swap needs 1 MiB" in out["message"], out
            assert snapshot(sc.venv) == before
            with pytest.raises(OSError):
                while os.write(fd, b"\0" * 4096):
                    pass
        finally:
            os.close(fd)
        code, out = run(sc, "apply", str(sc.request))
        assert (code, out["result"]) == (5, "no-space"), out
        assert "nothing was changed" in out["message"]
        assert snapshot(sc.venv) == before
        (mnt / "filler").unlink()
        code, out = run(sc, "apply", str(sc.request))
        assert (code, out["result"]) == (0, "applied"), out
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_status_reports_a_running_holder(script: Path, tmp_path: Path,
        elves: dict[str, bytes]) -> None:
    import fcntl

    sc = scene(script, tmp_path, lane_versions(elves, n=2))
    run(sc, "status")
    with open(sc.venv / ".ddtree-deploy" / "overlay" / "lock", "r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.truncate(0)
        fh.write(json.dumps({"pid": 4242, "command": "apply"}))
        fh.flush()
        code, out = run(sc, "status")
        assert code == 0 and out["running"] is True and out["holder"]["pid"] == 4242


def test_bad_record_path_is_refused(script: Path, tmp_path: Path,
        elves: dict[str, bytes]) -> None:
    sc = scene(script, tmp_path, lane_versions(elves, n=2))
    req = json.loads(sc.request.read_text())
    req["plan"]["changes"][0]["send"][0]["path"] = "../../../../../etc/evil"
    sc.request.write_text(json.dumps(req))
    before = snapshot(sc.venv)
    code, out = run(sc, "apply", str(sc.request))
    assert code == 2 and "leaves the venv" in out["message"]
    assert snapshot(sc.venv) == before


def test_a_folder_symlinked_out_of_the_venv_is_refused(script: Path, tmp_path: Path,
        elves: dict[str, bytes]) -> None:
    # A path that stays in the venv as text but leads out of it through a symlinked folder.
    sc = scene(script, tmp_path, lane_versions(elves, n=2))
    outside = tmp_path / "outside"
    outside.mkdir()
    req = json.loads(sc.request.read_text())
    sent = req["plan"]["changes"][0]["send"][0]["path"]
    top = sent.split("/")[0]
    site = next(sc.venv.glob("lib/python*/site-packages"))
    os.symlink(outside, site / "escape")
    req["plan"]["changes"][0]["send"][0]["path"] = "escape/" + sent[len(top) + 1:]
    sc.request.write_text(json.dumps(req))
    before = snapshot(sc.venv)
    code, out = run(sc, "apply", str(sc.request))
    assert code == 2 and "leaves the venv" in out["message"], out
    assert snapshot(sc.venv) == before and list(outside.iterdir()) == []


# -- faults --------------------------------------------------------------------------------


def _phase_at(steps: dict[str, int], n: int) -> str:
    total = 0
    for phase, count in steps.items():
        total += count
        if n <= total:
            return phase
    return "after"


def test_sigkill_at_random_points_never_mixes(script: Path, tmp_path: Path,
        elves: dict[str, bytes]) -> None:
    lane = lane_versions(elves, n=40)
    clean = scene(script, tmp_path / "clean", lane)
    t0 = time.monotonic()
    code, out = run(clean, "apply", str(clean.request))
    duration = time.monotonic() - t0
    assert code == 0, out
    steps = out["steps"]
    total = sum(steps.values())
    seed = int(os.environ.get("DDTREE_FAULT_SEED", "20240611"))
    log: list[str] = []
    phases: set[str] = set()
    for trial in range(24):
        rng = random.Random(seed + trial)
        sc = scene(script, tmp_path / f"t{trial}", lane)
        before = snapshot(sc.venv)
        argv = [str(sc.venv / "bin" / "python"), str(script), "--venv", str(sc.venv), "apply",
                str(sc.request), "--token", f"trial{trial}"]
        if trial % 3 == 2:  # a kill from outside at a random time
            delay = rng.uniform(0.0, duration)
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            point = f"external SIGKILL after {delay:.3f}s"
        else:
            phase = list(steps)[trial % len(steps)]  # spread over every phase
            first = sum(list(steps.values())[: list(steps).index(phase)]) + 1
            n = rng.randint(first, first + steps[phase] - 1)
            subprocess.run(argv, env={**os.environ, "DDTREE_DEPLOY_FAULT_STEP": str(n)},
                           capture_output=True, check=False)
            phases.add(_phase_at(steps, n))
            point = f"step {n}/{total} ({_phase_at(steps, n)})"
        if trial % 4 == 1:  # and kill the recovery itself once
            m = rng.randint(1, 20)
            run(sc, "status", env={"DDTREE_DEPLOY_FAULT_STEP": str(m)})
            point += f", recovery killed at step {m}"
        log.append(f"trial {trial} seed {seed + trial}: {point}")
        code, status = run(sc, "status", "--token", f"trial{trial}")
        state = lane_state(sc)
        assert code == 0 and state in ("old", "new"), "\n".join(log) + f"\n-> {state} {status}"
        if state == "old":
            assert snapshot(sc.venv) == before, log[-1]
            assert status["token_result"] is None or status["token_result"]["result"] in (
                "rolled-back",), log[-1]
            blobs = Path(overlay_apply.staging_dir(str(sc.venv), sc.plan.id)) / "blobs"
            staged = {p.name for p in blobs.iterdir()}  # nothing needs sending again
            assert staged == {f.sha256 for c in sc.plan.changes for f in c.send}, log[-1]
        code, out = run(sc, "apply", str(sc.request))
        assert code == 0 and out["result"] in ("applied", "unchanged"), (log[-1], out)
        assert lane_state(sc) == "new", log[-1]
    print("\n".join(log))
    assert set(steps) == phases == {"planned", "backing-up", "swapping", "checking", "done"}


# -- the workstation side ------------------------------------------------------------------


def test_apply_plan_detached_over_local_transport(script: Path, tmp_path: Path,
                                                  elves: dict[str, bytes]) -> None:
    sc = scene(script, tmp_path, lane_versions(elves, n=5))
    before = snapshot(sc.venv)
    checks = LaneChecks(torch_cuda="13.0", extension_cudart_major=13, imports=["torch"])
    seen: list[dict[str, Any]] = []
    with LocalTransport() as t:
        outcome = overlay_apply.apply_plan(t, sc.plan, checks, poll=0.05, on_status=seen.append)
        assert outcome.result == "applied" and outcome.backup
        assert lane_state(sc) == "new" and seen
        assert overlay_apply.status(t, str(sc.venv))["journal"]["phase"] == "done"
        back = overlay_apply.rollback(t, str(sc.venv), poll=0.05)
        assert back.result == "rolled-back"
        assert snapshot(sc.venv) == before
        assert [h["result"] for h in overlay_apply.history(t, str(sc.venv))[0]] == [
            "applied", "rolled-back"]
        with pytest.raises(DeployError, match="nothing to roll back"):
            overlay_apply.rollback(t, str(sc.venv), poll=0.05)
        big = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize * 2
        stage(sc.venv, sc.plan, {hashlib.sha256(d).hexdigest(): d
                                 for _m, fs in lane_versions(elves, n=5)["new"].values()
                                 for d in fs.values()})
        with pytest.raises(RefusedError, match="not enough free space"):
            overlay_apply.apply_plan(t, sc.plan, checks, reserve=big, poll=0.05)
        assert snapshot(sc.venv) == before


def test_script_is_one_stdlib_file() -> None:
    source = overlay_apply.script_source()
    assert "ddtree_deploy" not in source.replace("ddtree-deploy", "")
    compile(source, "apply_remote.py", "exec")
    assert source.count("from __future__") == 1
