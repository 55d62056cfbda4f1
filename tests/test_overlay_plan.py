"""The overlay plan: manifests from RECORD, the diff per distribution, and the dry-run table.

Unit tests use small hand-made manifests. The integration tests install the lab's
wheels (stand-in torch/nvidia/sglang-kernel built here, the registry's real
nvidia-cuda-runtime wheels) into two scratch venvs with pip, read them with the
remote manifest script through LocalTransport, plan cu128 -> cu130, carry the plan
out by hand and check that planning again changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import wheelcache
from rich.console import Console

from ddtree_deploy.errors import DeployError, RemoteCommandError
from ddtree_deploy.overlay.lanefile import Lane, load_lane
from ddtree_deploy.overlay.manifest import ManifestReport, read_manifest
from ddtree_deploy.overlay.model import (
    DistChange,
    DistManifest,
    FileEntry,
    OverlayPlan,
    VenvManifest,
)
from ddtree_deploy.overlay.plan import PlanError, is_noop, plan
from ddtree_deploy.overlay.render import counts, human_bytes, render_plan
from ddtree_deploy.remote.overlay_manifest import record_hash
from ddtree_deploy.transport.local import LocalTransport

SP = "lib/python3.11/site-packages"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _dist(name: str, version: str, files: dict[str, bytes]) -> DistManifest:
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    entries = [FileEntry(path=p, sha256=_sha(d), size=len(d)) for p, d in files.items()]
    entries.append(FileEntry(path=f"{info}/RECORD", sha256=_sha(name.encode() + version.encode()),
                             size=10))
    return DistManifest(name=name, version=version, dist_info=info, files=entries)


def _venv(path: str, *dists: DistManifest, python: str = "3.11.9") -> VenvManifest:
    return VenvManifest(venv=path, site_packages=f"{path}/{SP}", python=python,
                        dists={d.name: d for d in dists})


def _lane(**overrides: object) -> Lane:
    data: dict[str, object] = {
        "lane": "cu130",
        "source": {"host": "ct129", "venv": "/root/ml-env"},
        "distributions": ["torch", "nvidia-cu*", "sglang-kernel", "sgl-kernel"],
        "required": ["torch"],
        "exclude": ["nvidia-*-cu12"],
        "supersedes": ["nvidia-*-cu12"],
    }
    data.update(overrides)
    return Lane.model_validate(data)


def _change(p: OverlayPlan, name: str) -> DistChange:
    return next(c for c in p.changes if c.name == name)


TORCH_NEW = {"torch/__init__.py": b"init", "torch/lib/libtorch_cuda.so": b"cu130" * 100,
             "torch/version.py": b"cuda = '13.0'", "../../../bin/torchrun": b"#!python\nrun"}
TORCH_OLD = {"torch/__init__.py": b"init", "torch/lib/libtorch_cuda.so": b"cu128" * 90,
             "torch/version.py": b"cuda = '12.8'", "torch/old_only.py": b"gone"}


def test_actions_send_keep_delete_backup() -> None:
    src = _venv("/root/ml-env",
                _dist("torch", "2.11.0", TORCH_NEW),
                _dist("nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": b"13"}),
                _dist("numpy", "2.0", {"numpy/x.py": b"n"}))  # not in the lane: ignored
    dst = _venv("/root/venv",
                _dist("torch", "2.11.0+cu128", TORCH_OLD),
                _dist("nvidia-cuda-runtime-cu12", "12.8.90",
                      {"nvidia/__init__.py": b"",
                       "nvidia/cuda_runtime/lib/libcudart.so.12": b"12"}),
                _dist("sgl-kernel", "0.3.21", {"sgl_kernel/__init__.py": b"old kernel"}))
    p = plan(_lane(), src, dst, set(), target_host="ct200")
    assert [(c.name, c.action) for c in p.changes] == [
        ("nvidia-cuda-runtime", "add"),
        ("nvidia-cuda-runtime-cu12", "remove"),  # superseded
        ("sgl-kernel", "remove"),  # in the lane on the target, absent from the source's lane
        ("torch", "replace"),
    ]
    assert (p.source.host, p.source.venv, p.target.host, p.target.venv) == (
        "ct129", "/root/ml-env", "ct200", "/root/venv")
    torch = _change(p, "torch")
    assert (torch.old_version, torch.new_version) == ("2.11.0+cu128", "2.11.0")
    assert [f.path for f in torch.keep] == ["torch/__init__.py"]  # identical on the target
    assert sorted(f.path for f in torch.send) == sorted(
        ["../../../bin/torchrun", "torch-2.11.0.dist-info/RECORD", "torch/lib/libtorch_cuda.so",
         "torch/version.py"])
    assert torch.delete == ["torch-2.11.0+cu128.dist-info/RECORD", "torch/old_only.py"]
    assert torch.backup == sorted(f.path for f in dst.dists["torch"].files)
    cu12 = _change(p, "nvidia-cuda-runtime-cu12")
    assert cu12.send == [] and cu12.new_version is None
    assert cu12.delete == cu12.backup and "nvidia/__init__.py" in cu12.delete
    assert "numpy" not in {c.name for c in p.changes}
    want = sum(f.size for c in p.changes for f in c.send)
    assert p.bytes_to_send == want and want > 0


def test_delete_spares_paths_that_stay_owned() -> None:
    # nvidia/__init__.py: listed by a removed cu12 wheel, by a new wheel and by a wheel the
    # plan leaves alone; it must never be deleted while someone still lists it.
    shared = {"nvidia/__init__.py": b""}
    src = _venv("/v", _dist("torch", "1", {"torch/a.py": b"a"}),
                _dist("nvidia-cublas", "13", {**shared, "nvidia/cu13/lib/libcublas.so.13": b"b"}))
    dst = _venv("/w", _dist("torch", "0", {"torch/a.py": b"old"}),
                _dist("nvidia-cublas-cu12", "12", {**shared, "nvidia/cublas/lib/x.so.12": b"c"}),
                _dist("nvidia-ml-py", "13", {"pynvml.py": b"p", "nvidia/__init__.py": b""}))
    p = plan(_lane(), src, dst, set())
    cu12 = _change(p, "nvidia-cublas-cu12")
    assert "nvidia/__init__.py" not in cu12.delete and "nvidia/__init__.py" in cu12.backup
    assert cu12.delete == sorted(["nvidia_cublas_cu12-12.dist-info/RECORD",
                                          "nvidia/cublas/lib/x.so.12"])
    new = _change(p, "nvidia-cublas")
    assert "nvidia/__init__.py" in [f.path for f in new.keep]  # same content, same path
    assert "nvidia-ml-py" not in {c.name for c in p.changes}


def test_cache_and_duplicate_contents_count_once() -> None:
    blob = b"x" * 1000
    src = _venv("/v", _dist("torch", "1", {"torch/a.so": blob, "torch/b.so": blob,
                                           "torch/c.so": b"y" * 300}))
    dst = _venv("/w")
    p = plan(_lane(), src, dst, set())
    record = next(f for f in _change(p, "torch").send if f.path.endswith("RECORD"))
    assert p.bytes_to_send == 1000 + 300 + record.size
    p2 = plan(_lane(), src, dst, {_sha(blob), record.sha256})
    assert p2.bytes_to_send == 300
    assert p2.id == p.id  # the id names the new manifests, not what the cache holds


def test_target_already_equal_is_all_same() -> None:
    torch = _dist("torch", "2.11.0", TORCH_NEW)
    src, dst = _venv("/v", torch), _venv("/w", torch.model_copy(deep=True))
    p = plan(_lane(), src, dst, set())
    assert is_noop(p) and p.bytes_to_send == 0
    only = p.changes[0]
    assert only.action == "same" and only.send == only.delete == only.backup == []
    assert len(only.keep) == len(torch.files)


def test_bytecode_is_derived_not_moved() -> None:
    pyc = "torch/__pycache__/__init__.cpython-311.pyc"
    src = _venv("/v", _dist("torch", "2", {"torch/__init__.py": b"new", pyc: b"compiled on src"}))
    dst = _venv("/w", _dist("torch", "1", {"torch/__init__.py": b"old", pyc: b"compiled on dst",
                                           "torch/__pycache__/gone.cpython-311.pyc": b"g"}))
    p = plan(_lane(), src, dst, set())
    torch = _change(p, "torch")
    assert pyc not in [f.path for f in torch.send + torch.keep]
    assert pyc in torch.delete and pyc in torch.backup  # stale bytecode goes with the old files
    # the same sources with bytecode Python rewrote since: nothing to do
    rewritten = _venv("/w", _dist("torch", "2", {"torch/__init__.py": b"new", pyc: b"later"}))
    assert is_noop(plan(_lane(), src, rewritten, set()))
    assert plan(_lane(), rewritten, src, set()).id == p.id


def test_id_is_stable_and_names_the_content() -> None:
    a = _dist("torch", "1", {"torch/a.py": b"a", "torch/b.py": b"b"})
    b = _dist("nvidia-cublas", "13", {"nvidia/cu13/x": b"x"})
    shuffled = a.model_copy(update={"files": list(reversed(a.files))})
    p1 = plan(_lane(), _venv("/v", a, b), _venv("/w"), set())
    p2 = plan(_lane(), _venv("/v", b, shuffled), _venv("/other"), {"abc"})
    assert p1.id == p2.id and len(p1.id) == 64
    changed = _dist("torch", "1", {"torch/a.py": b"a", "torch/b.py": b"B"})
    assert plan(_lane(), _venv("/v", changed, b), _venv("/w"), set()).id != p1.id


@pytest.mark.parametrize("bad", ["../../../../etc/cron.d/x", "../../../../../root/.ssh/k"])
def test_paths_leaving_the_venv_are_refused(bad: str) -> None:
    src = _venv("/v", _dist("torch", "1", {"torch/a.py": b"a", bad: b"evil"}))
    with pytest.raises(PlanError, match="leaves the venv /v; refusing"):
        plan(_lane(), src, _venv("/w"), set())
    # ../../../bin is the venv's bin folder: allowed
    ok = _venv("/v", _dist("torch", "1", {"../../../bin/torchrun": b"t"}))
    assert plan(_lane(), ok, _venv("/w"), set()).changes[0].action == "add"


def test_refusals() -> None:
    torch = _dist("torch", "1", {"torch/a.py": b"a"})
    with pytest.raises(PlanError, match="lacks torch, which lane cu130 requires"):
        plan(_lane(), _venv("/v", _dist("nvidia-cublas", "13", {})), _venv("/w"), set())
    with pytest.raises(PlanError, match=r"Python 3\.12\.1 and the target 3\.11\.9"):
        plan(_lane(), _venv("/v", torch, python="3.12.1"), _venv("/w"), set())
    clash = _dist("sglang-kernel", "1", {"torch/a.py": b"other"})
    with pytest.raises(PlanError, match="torch and sglang-kernel both install torch/a.py"):
        plan(_lane(), _venv("/v", torch, clash), _venv("/w"), set())
    assert issubclass(PlanError, DeployError)


def test_render_counts_and_noop_message() -> None:
    src = _venv("/v", _dist("torch", "2.11.0", TORCH_NEW))
    dst = _venv("/w", _dist("torch", "2.11.0+cu128", TORCH_OLD),
                _dist("nvidia-cublas-cu12", "12", {"nvidia/cublas/lib/x.so.12": b"c" * 2048}))
    p = plan(_lane(), src, dst, set(), target_host="ct200")
    c = counts(_change(p, "torch"))
    # replaced: sent over an old path (libtorch_cuda.so, version.py); added: new paths.
    assert (c.replaced, c.added, c.removed, c.kept) == (2, 2, 2, 1)
    console = Console(record=True, width=160)
    render_plan(p, console)
    out = console.export_text()
    assert "2.11.0+cu128 -> 2.11.0" in out and "nvidia-cublas-cu12" in out and "remove" in out
    assert f"to send: {human_bytes(p.bytes_to_send)} ({p.bytes_to_send} bytes)" in out
    assert "1 replace, 1 remove" in out and p.id in out
    same = plan(_lane(), src, _venv("/w", *src.dists.values()), set())
    console = Console(record=True, width=160)
    render_plan(same, console)
    assert "nothing to do: the target already holds this lane" in console.export_text()
    assert human_bytes(512) == "512 B" and human_bytes(1536) == "1.5 KiB"


def test_record_hash_decoding() -> None:
    digest = hashlib.sha256(b"hello").digest()
    b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert record_hash(f"sha256={b64}") == digest.hex()
    assert record_hash("md5=abc") is None and record_hash("") is None
    assert record_hash("sha256=!!!") is None and record_hash("sha256=YWJj") is None


# ---- integration: real dist layouts installed by pip, read by the remote script ------------


def _pip_install(venv: Path, wheels: list[Path]) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "--quiet", "--no-deps", "--no-index", *map(str, wheels)],
                   check=True, capture_output=True)


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    python = shutil.which("python3.11")
    if shutil.which("gcc") is None or python is None:
        pytest.skip("needs gcc and python3.11 to build and install the stand-in wheels")
    from ddtree_lab import standin_wheels as sw

    root = tmp_path_factory.mktemp("overlay")
    runtime = {"cu130": wheelcache.wheel("nvidia-cuda-runtime", "13.0.96"),  # tests/wheels.toml
               "cu128": wheelcache.wheel("nvidia-cuda-runtime-cu12", "12.8.90")}
    # a distribution with a console script, so RECORD lists ../../../bin/<script>
    tool = sw.write_wheel(root / "w", name="torch-tool", version="1.0", tags=("py3-none-any",),
                          metadata="Metadata-Version: 2.1\nName: torch-tool\nVersion: 1.0\n\n",
                          files={"torch_tool/__init__.py": b"def main():\n    return 0\n",
                                 "torch_tool-1.0.dist-info/entry_points.txt":
                                 b"[console_scripts]\ntorch-tool = torch_tool:main\n"},
                          purelib=True)
    triton = sw.build_triton(root / "w")  # one file for both: pip's direct_url.json names it
    out = []
    for name, lane in (("src", "cu130"), ("dst", "cu128")):
        venv = root / name
        subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
        d = root / "w" / lane
        wheels = [sw.build_torch(d, lane, runtime[lane]), runtime[lane],
                  *sw.build_nvidia_standins(d, lane), sw.build_torchvision(d, lane), triton]
        if lane == "cu130":
            wheels += [sw.build_sglang_kernel(root / "w" / "sgl"), tool]
        _pip_install(venv, wheels)
        out.append(venv)
    return out[0], out[1]


def _lab_lane(src: Path) -> Lane:
    lane = load_lane("cu130").with_source(host="local", venv=str(src))
    # the test lane adds the script-bearing distribution
    return lane.model_copy(update={"distributions": [*lane.distributions, "torch-tool"]})


def _manifests(lane: Lane, src: Path, dst: Path, verify: bool = False
               ) -> tuple[ManifestReport, ManifestReport]:
    t = LocalTransport()
    return (read_manifest(t, str(src), lane.source_patterns(), verify=verify),
            read_manifest(t, str(dst), lane.target_patterns(), verify=verify))


def _carry_out(p: OverlayPlan, src: VenvManifest, dst: VenvManifest) -> None:
    """Apply a plan by hand (the test's own minimal apply): delete, then place sent files.

    A path several old distributions list (nvidia/__init__.py of the cu12 wheels) is in
    each one's delete list, so it may be gone already."""
    s, d = Path(src.site_packages), Path(dst.site_packages)
    for change in p.changes:
        for rel in change.delete:
            (d / rel).unlink(missing_ok=True)
        for f in change.send:
            data = (s / f.path).read_bytes()
            assert _sha(data) == f.sha256 and len(data) == f.size
            (d / f.path).parent.mkdir(parents=True, exist_ok=True)
            (d / f.path).write_bytes(data)
    for change in p.changes:  # folders the deletions emptied (old dist-info folders)
        for rel in change.delete:
            parent = (d / rel).parent
            while parent != d and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent


def test_manifest_from_record_of_real_layouts(venvs: tuple[Path, Path]) -> None:
    src, dst = venvs
    lane = _lab_lane(src)
    s, t = _manifests(lane, src, dst, verify=True)
    assert s.mismatches == {} and t.mismatches == {}
    sm = s.manifest
    assert sm.venv == str(src) and sm.site_packages == str(src / SP)
    assert sm.python.startswith("3.11.")
    assert {"torch", "triton", "torchvision", "nvidia-cuda-runtime", "nvidia-cudnn-cu13",
            "sglang-kernel", "torch-tool"} <= set(sm.dists)
    assert not any(n.endswith("-cu12") for n in sm.dists)
    torch = sm.dists["torch"]
    assert torch.dist_info == "torch-2.11.0.dist-info" and torch.version == "2.11.0"
    assert t.manifest.dists["torch"].version == "2.11.0+cu128"
    # every file of RECORD is there with its size and sha256, including RECORD itself (hashed
    # on the spot) and the .pyc files pip compiled
    for dist in sm.dists.values():
        record = (src / SP / dist.dist_info / "RECORD")
        lines = [ln.split(",")[0] for ln in record.read_text().splitlines() if ln]
        assert sorted(f.path for f in dist.files) == sorted(lines)
        for f in dist.files:
            data = (src / SP / f.path).read_bytes()
            assert (f.size, f.sha256) == (len(data), _sha(data)), f.path
    tool = [f.path for f in sm.dists["torch-tool"].files]
    assert "../../../bin/torch-tool" in tool and (src / "bin" / "torch-tool").is_file()
    assert any(p.endswith(".pyc") for p in tool)


def test_plan_apply_replan_is_a_noop(venvs: tuple[Path, Path], tmp_path: Path) -> None:
    src0, dst0 = venvs
    src, dst = tmp_path / "src", tmp_path / "dst"
    shutil.copytree(src0, src, symlinks=True)
    shutil.copytree(dst0, dst, symlinks=True)
    lane = _lab_lane(src)
    s, t = _manifests(lane, src, dst)
    p = plan(lane, s.manifest, t.manifest, set(), target_host="local")
    actions = {c.name: c.action for c in p.changes}
    assert actions["torch"] == "replace" and actions["torchvision"] == "replace"
    assert actions["triton"] == "same"  # the same wheel on both sides
    assert actions["nvidia-cuda-runtime"] == "add" and actions["sglang-kernel"] == "add"
    assert actions["nvidia-cuda-runtime-cu12"] == "remove"
    assert {n for n, a in actions.items() if a == "remove"} == {
        n for n in t.manifest.dists if n.endswith("-cu12")}
    _carry_out(p, s.manifest, t.manifest)
    s2, t2 = _manifests(lane, src, dst, verify=True)
    assert t2.mismatches == {}
    # Python compiles the new sources on first import: still nothing to do afterwards
    subprocess.run([str(dst / "bin" / "python"), "-m", "compileall", "-q", "-f",
                    str(dst / SP / "torch")], check=True, capture_output=True)
    again = plan(lane, s2.manifest, t2.manifest, set(), target_host="local")
    assert is_noop(again) and again.bytes_to_send == 0 and again.id == p.id
    assert not any(n.endswith("-cu12") for n in t2.manifest.dists)
    assert not list((dst / SP).glob("*-cu12*")) and not list((dst / SP).glob("torch-*cu128*"))
    assert not (dst / SP / "nvidia" / "cuda_runtime").exists() or not any(
        (dst / SP / "nvidia" / "cuda_runtime").rglob("*.so*"))


def test_verify_reports_tampered_and_missing_files(venvs: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(venvs[0], src, symlinks=True)
    init = src / SP / "torch" / "__init__.py"
    init.write_bytes(init.read_bytes() + b"# patched\n")
    (src / SP / "torch" / "version.py").unlink()
    report = read_manifest(LocalTransport(), str(src), ["torch"], verify=True)
    assert sorted(report.mismatches["torch"]) == sorted([
        f"torch/__init__.py: size {init.stat().st_size}, RECORD says "
        f"{init.stat().st_size - len(b'# patched' + chr(10).encode())}",
        "torch/version.py: missing"])
    assert read_manifest(LocalTransport(), str(src), ["torch"]).mismatches == {}


def test_broken_venvs_are_refused_clearly(venvs: tuple[Path, Path], tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(venvs[0], src, symlinks=True)
    sp = src / SP
    shutil.copytree(sp / "torch-2.11.0.dist-info", sp / "torch-2.9.1.dist-info")
    (sp / "triton-3.6.0.dist-info" / "RECORD").unlink()
    (sp / "torchvision-0.0.1.dist-info").mkdir()  # empty leftovers are ignored
    with pytest.raises(RemoteCommandError) as info:
        read_manifest(LocalTransport(host="ct129"), str(src), ["torch*", "triton"])
    text = str(info.value)
    assert "torch is installed twice: torch-2.11.0.dist-info and torch-2.9.1.dist-info" in text
    assert "triton-3.6.0.dist-info: no readable RECORD" in text and text.startswith("ct129: ")
    assert "torchvision-0.0.1" not in text
    with pytest.raises(RemoteCommandError, match=r"no runnable python at /nonexistent/bin/python"):
        read_manifest(LocalTransport(), "/nonexistent", ["torch"])
