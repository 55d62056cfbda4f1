"""The GPU rehearsal's carry set (rehearsal/carry*.py): the sm90 repack on small synthetic wheels,
the size guard, build end to end with a stand-in registry, and install refusing a tampered file.
No network: wheels are made here, in tmp_path."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rehearsal import carry
from rehearsal.carry_repack import PROFILES, record_problems, repack
from rehearsal.carry_set import (
    CARRY_SET,
    HOST_HAS,
    LIMIT_BYTES,
    MIB,
    CarryError,
    check_budget,
    load_carry_set,
    parse_carry_set,
    sha256_file,
    tree_bytes,
)

REPO = Path(__file__).resolve().parent.parent
SM90 = PROFILES["sm90"][0]
HEADER = "name\tversion\tinto\trepack\tsize\tcarried\tsha256\tfilename\twhy"


def _rec(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], *,
               extra_unlisted: dict[str, bytes] | None = None,
               record_override: dict[str, str] | None = None) -> Path:
    """A wheel with a correct RECORD (unless overridden): `files` plus its dist-info."""
    di = f"{name}-{version}.dist-info"
    meta = {
        f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                       b"Tag: py3-none-any\n",
    }
    everything = {**files, **meta}
    lines = [f"{n},{(record_override or {}).get(n, _rec(d))},{len(d)}"
             for n, d in everything.items()]
    lines.append(f"{di}/RECORD,,")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in {**everything, **(extra_unlisted or {})}.items():
            zf.writestr(n, d)
        zf.writestr(f"{di}/RECORD", "\n".join(lines) + "\n")
    return path


KERNEL_KEEP = {
    "sgl_kernel/__init__.py": b"from sgl_kernel.load_utils import x\n",
    "sgl_kernel/load_utils.py": b"x = 1\n",
    "sgl_kernel/sm90/common_ops.abi3.so": b"\x7fELF sm90" * 50,
    "sgl_kernel/spatial_ops.abi3.so": b"\x7fELF spatial",
    "include/dlpack/dlpack.h": b"/* dlpack */\n",
}
KERNEL_DROP = {
    "sgl_kernel/flash_ops.abi3.so": b"\x7fELF fa3" * 400,
    "sgl_kernel/flashmla_ops.abi3.so": b"\x7fELF mla",
    "sgl_kernel/sm100/common_ops.abi3.so": b"\x7fELF sm100" * 40,
    "deep_gemm/__init__.py": b"",
    "deep_gemm/include/deep_gemm/a.cuh": b"// a\n",
    "triton_kernels/__init__.py": b"",
    "triton_kernels/matmul_ogs.py": b"pass\n",
    "_mscclpp.cpython-310-x86_64-linux-gnu.so": b"\x7fELF mscclpp",
    "lib/mscclpp.so.0.6.0": b"\x7fELF",
    "lib/libmscclpp_static.a": b"!<arch>",
    "include/mscclpp/core.hpp": b"//\n",
    "include/include/nccl.h": b"//\n",
}


def kernel_wheel(folder: Path) -> Path:
    return make_wheel(folder, "sglang_kernel", "0.4.2", {**KERNEL_KEEP, **KERNEL_DROP},
                      extra_unlisted={"sglang_kernel-0.4.2.dist-info/RECORD.jws": b"{}"})


# -- the repack -----------------------------------------------------------------------------------


def test_sm90_repack_keeps_sm90_drops_the_rest_and_rewrites_record(tmp_path: Path) -> None:
    src = kernel_wheel(tmp_path / "src")
    res = repack(src, tmp_path / "out", SM90)
    assert res.path.name == src.name  # name and version kept: sglang checks sgl_kernel's version
    assert set(res.dropped) == set(KERNEL_DROP) | {"sglang_kernel-0.4.2.dist-info/RECORD.jws"}
    with zipfile.ZipFile(res.path) as zf:
        names = set(zf.namelist())
        for n, data in KERNEL_KEEP.items():
            assert zf.read(n) == data
        assert "Version: 0.4.2" in zf.read("sglang_kernel-0.4.2.dist-info/METADATA").decode()
        record = zf.read("sglang_kernel-0.4.2.dist-info/RECORD").decode()
    assert not names & set(KERNEL_DROP)
    for n in KERNEL_DROP:
        assert n not in record
    assert record_problems(res.path) == []
    assert res.sha256 == sha256_file(res.path) and res.size == res.path.stat().st_size
    assert res.kept == len(KERNEL_KEEP) + 2  # + METADATA, WHEEL


def test_repack_is_deterministic(tmp_path: Path) -> None:
    src = kernel_wheel(tmp_path / "src")
    assert repack(src, tmp_path / "a", SM90).sha256 == repack(src, tmp_path / "b", SM90).sha256


def test_record_checker_finds_what_is_wrong(tmp_path: Path) -> None:
    bad = make_wheel(tmp_path, "w", "1.0", {"w/a.py": b"a", "w/b.py": b"b"},
                     extra_unlisted={"w/c.py": b"c"}, record_override={"w/a.py": _rec(b"other")})
    problems = record_problems(bad)
    assert any(p.startswith("w/a.py: RECORD hash") for p in problems)
    assert "w/c.py: not in RECORD" in problems


def test_repacked_wheel_installs_with_pip_target(tmp_path: Path) -> None:
    res = repack(kernel_wheel(tmp_path / "src"), tmp_path / "out", SM90)
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                           "--no-deps", "--no-compile", "--target", str(site), str(res.path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (site / "sgl_kernel/sm90/common_ops.abi3.so").read_bytes() == \
        KERNEL_KEEP["sgl_kernel/sm90/common_ops.abi3.so"]
    assert not (site / "sgl_kernel/flash_ops.abi3.so").exists()
    assert not (site / "sgl_kernel/sm100").exists() and not (site / "deep_gemm").exists()
    installed = (site / "sglang_kernel-0.4.2.dist-info/RECORD").read_text()
    assert "sgl_kernel/sm90/common_ops.abi3.so" in installed and "flash_ops" not in installed


def test_repack_refuses_a_file_that_disagrees_with_its_record(tmp_path: Path) -> None:
    src = make_wheel(tmp_path, "sglang_kernel", "0.4.2", dict(KERNEL_KEEP),
                     record_override={"sgl_kernel/load_utils.py": _rec(b"y = 2\n")})
    with pytest.raises(CarryError, match="load_utils.py does not match the wheel's own RECORD"):
        repack(src, tmp_path / "out", SM90)
    assert not list((tmp_path / "out").glob("*"))  # nothing half-written left


def test_repack_refuses_a_pattern_that_would_drop_metadata(tmp_path: Path) -> None:
    src = make_wheel(tmp_path, "w", "1.0", {"w/a.py": b"a"})
    with pytest.raises(CarryError, match="metadata"):
        repack(src, tmp_path / "out", ("*METADATA",))


# -- the size guard ---------------------------------------------------------------------------


def _git_repo(root: Path) -> Path:
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def test_tree_bytes_is_tracked_plus_untracked_not_ignored(tmp_path: Path) -> None:
    repo = _git_repo(tmp_path / "repo")
    (repo / ".gitignore").write_text("/ignored/\n")  # 10 bytes, untracked, counted
    (repo / "tracked.txt").write_bytes(b"x" * 100)
    subprocess.run(["git", "-C", str(repo), "add", "tracked.txt"], check=True)
    (repo / "new.txt").write_bytes(b"y" * 20)
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_bytes(b"z" * 5000)
    (repo / "carry").mkdir()
    (repo / "carry" / "w.whl").write_bytes(b"w" * 700)  # not ignored, but counted as the carry
    assert tree_bytes(repo, exclude=repo / "carry") == 100 + 20 + 10
    assert tree_bytes(repo) == 100 + 20 + 10 + 700


def test_check_budget_passes_at_the_limit_and_names_the_parts_over_it() -> None:
    assert check_budget({"tree": 61 * MIB, "carry": 2 * MIB}) == LIMIT_BYTES
    with pytest.raises(CarryError) as exc:
        check_budget({"working tree": 5 * MIB, "carry set": 58 * MIB + 1}, when="before")
    msg = str(exc.value)
    assert msg.startswith("before: ") and "63.00 MiB" in msg and "carry set 58.00 MiB" in msg


# -- build, lock and install with a stand-in registry --------------------------------------------


class Registry:
    """pip download's stand-in: copies wheels from a folder, counting calls."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.calls: list[str] = []

    def __call__(self, name: str, version: str, into: Path) -> Path:
        self.calls.append(f"{name}=={version}")
        src = next(self.folder.glob(f"{name}-{version}-*.whl"))
        dst = into / src.name
        dst.write_bytes(src.read_bytes())
        return dst


def fake_project(repo: Path, out: Path) -> Path:
    return make_wheel(out, "ddtree_deploy", "0.1.0", {"ddtree_deploy/__init__.py": b""})


@pytest.fixture
def world(tmp_path: Path) -> dict:
    repo = _git_repo(tmp_path / "repo")
    (repo / "README").write_text("hi\n")
    reg = tmp_path / "registry"
    kernel_wheel(reg)
    make_wheel(reg, "pure", "2.0", {"pure/__init__.py": b"P = 1\n"})
    tsv = repo / "carry-set.tsv"
    tsv.write_text("# test set\n" + HEADER + "\n"
                   "sglang_kernel\t0.4.2\tvenv\tsm90\t-\t-\t-\t-\tthe kernel\n"
                   "pure\t2.0\ttool\t-\t-\t-\t-\t-\tthe tool needs it\n"
                   "paramiko\t5.1.0\tskip\t-\t-\t-\t-\t-\tssh only\n")
    return {"repo": repo, "tsv": tsv, "registry": Registry(reg), "cache": tmp_path / "cache",
            "dest": repo / ".carry"}


def _build(w: dict, **kw: object) -> dict:
    return carry.build(w["dest"], repo=w["repo"], carry_set=w["tsv"], cache=w["cache"],
                       fetch=w["registry"], build_project=fake_project, out=lambda s: None, **kw)


def test_build_refuses_an_unlocked_set(world: dict) -> None:
    with pytest.raises(CarryError, match="rehearsal.carry lock"):
        _build(world)


def test_lock_then_build_writes_wheels_and_a_manifest_that_matches_them(world: dict) -> None:
    carry.lock(world["tsv"], cache=world["cache"], fetch=world["registry"], out=lambda s: None)
    entries = {e.name: e for e in load_carry_set(world["tsv"])}
    kernel = entries["sglang_kernel"]
    src = world["registry"].folder / kernel.filename
    assert kernel.sha256 == sha256_file(src) and kernel.size == src.stat().st_size
    assert 0 < kernel.carried < kernel.size  # the repacked size
    assert world["tsv"].read_text().startswith("# test set\n")  # comments kept
    world["registry"].calls.clear()

    manifest = _build(world)
    assert world["registry"].calls == []  # lock left the registry's wheels in the cache
    dest = world["dest"]
    on_disk = json.loads((dest / "manifest.json").read_text())
    assert on_disk == manifest
    by_name = {f["name"]: f for f in manifest["files"]}
    assert set(by_name) == {"sglang_kernel", "pure", "ddtree-deploy"}
    for f in manifest["files"]:
        assert sha256_file(dest / f["path"]) == f["sha256"]
    k = by_name["sglang_kernel"]
    assert k["path"] == f"venv/{kernel.filename}" and k["source_sha256"] == kernel.sha256
    assert k["dropped"]["sgl_kernel/flash_ops*.so"] == 1 and k["dropped"]["deep_gemm/*"] == 2
    assert record_problems(dest / k["path"]) == []
    assert by_name["pure"]["into"] == "tool" and by_name["ddtree-deploy"]["into"] == "tool"
    assert manifest["not_carried"] == [{"name": "paramiko", "version": "5.1.0",
                                        "why": "ssh only"}]
    assert manifest["sizes"]["tree"] == len("hi\n") + world["tsv"].stat().st_size


def test_build_fails_before_downloading_when_over_the_limit(world: dict) -> None:
    carry.lock(world["tsv"], cache=world["cache"], fetch=world["registry"], out=lambda s: None)
    for f in world["cache"].iterdir():
        f.unlink()
    world["registry"].calls.clear()
    with pytest.raises(CarryError, match="before downloading: working tree \\+ carry set"):
        _build(world, limit=1000)
    assert world["registry"].calls == [] and not world["dest"].exists()


def test_build_refuses_a_cached_wheel_with_the_wrong_sha256(world: dict) -> None:
    carry.lock(world["tsv"], cache=world["cache"], fetch=world["registry"], out=lambda s: None)
    cached = next(world["cache"].glob("pure-*.whl"))
    cached.write_bytes(cached.read_bytes() + b"\0")
    with pytest.raises(CarryError, match="pure-2.0-py3-none-any.whl: sha256 .* refusing it"):
        _build(world)


def test_build_refuses_a_download_with_the_wrong_sha256(world: dict) -> None:
    carry.lock(world["tsv"], cache=world["cache"], fetch=world["registry"], out=lambda s: None)
    next(world["cache"].glob("pure-*.whl")).unlink()
    src = next(world["registry"].folder.glob("pure-*.whl"))
    src.write_bytes(src.read_bytes() + b"\0")  # the registry now serves other bytes
    with pytest.raises(CarryError, match="downloaded sha256"):
        _build(world)
    assert not list(world["cache"].glob("pure-*.whl"))


def test_build_refuses_a_dest_holding_other_files(world: dict) -> None:
    carry.lock(world["tsv"], cache=world["cache"], fetch=world["registry"], out=lambda s: None)
    world["dest"].mkdir()
    (world["dest"] / "notes.txt").write_text("mine")
    with pytest.raises(CarryError, match="notes.txt"):
        _build(world)
    assert (world["dest"] / "notes.txt").read_text() == "mine"


class Recorder:
    def __init__(self, check: str = "[]") -> None:
        self.cmds: list[list[str]] = []
        self.check = check

    def __call__(self, cmd: list[str], what: str) -> str:
        self.cmds.append(cmd)
        if cmd[1] == "-c":
            return self.check
        return "ddtree-deploy 0.1.0\n" if cmd[-1] == "--version" else ""


def _built(world: dict) -> tuple[Path, Path]:
    carry.lock(world["tsv"], cache=world["cache"], fetch=world["registry"], out=lambda s: None)
    _build(world)
    venv = world["repo"].parent / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").write_text("")
    return world["dest"], venv


def test_install_refuses_a_tampered_file_and_installs_nothing(world: dict) -> None:
    dest, venv = _built(world)
    wheel = next((dest / "venv").glob("*.whl"))
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 1  # same size, other bytes
    wheel.write_bytes(bytes(data))
    rec = Recorder()
    with pytest.raises(CarryError, match=f"venv/{wheel.name}: sha256 [0-9a-f]{{64}}, the "
                                         "manifest says"):
        carry.install(dest, venv, run=rec, out=lambda s: None)
    assert rec.cmds == []


def test_install_refuses_a_manifest_path_outside_the_folder(world: dict) -> None:
    dest, venv = _built(world)
    m = json.loads((dest / "manifest.json").read_text())
    m["files"][0]["path"] = "../README"
    (dest / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CarryError, match="must stay inside the carry folder"):
        carry.install(dest, venv, run=Recorder(), out=lambda s: None)


def test_install_puts_venv_wheels_in_the_venv_and_the_tool_in_its_folder(world: dict) -> None:
    dest, venv = _built(world)
    rec = Recorder()
    launcher = carry.install(dest, venv, run=rec, out=lambda s: None)
    py = str((venv / "bin" / "python3").resolve())
    pip_venv, pip_tool, check, version = rec.cmds
    flags = ["-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
             "--upgrade"]
    assert pip_venv[0] == py and pip_venv[1:9] == flags and "--target" not in pip_venv
    assert [Path(p).name for p in pip_venv[10:]] == [
        "sglang_kernel-0.4.2-py3-none-any.whl"]
    site = str(dest / "tool-site")
    assert pip_tool[pip_tool.index("--target") + 1] == site
    assert sorted(Path(p).name for p in pip_tool[pip_tool.index("--target") + 2:]) == [
        "ddtree_deploy-0.1.0-py3-none-any.whl", "pure-2.0-py3-none-any.whl"]
    assert check[:2] == [py, "-c"] and json.loads(check[-1]) == ["paramiko"]
    assert version == [str(launcher), "--version"]
    text = launcher.read_text()
    assert text.startswith("#!/bin/sh\n") and py in text and site in text
    assert launcher.stat().st_mode & 0o111


def test_install_names_unmet_requirements(world: dict) -> None:
    dest, venv = _built(world)
    rec = Recorder(check='["typer>=0.12: 0.9.0 is installed"]')
    with pytest.raises(CarryError, match="typer>=0.12: 0.9.0 is installed"):
        carry.install(dest, venv, run=rec, out=lambda s: None)
    assert not (dest / "bin" / "ddtree-deploy").exists()


def test_install_without_a_manifest_exits_1_with_one_message(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    assert carry.main(["install", str(tmp_path), "--target", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no manifest" in err and "Traceback" not in err


def test_requirement_check_script_reads_real_metadata(tmp_path: Path) -> None:
    """The check `install` runs in the venv's Python, here against this venv plus a folder
    holding a made-up ddtree-deploy that wants one package this venv has and one it lacks."""
    site = tmp_path / "site"
    di = site / "ddtree_deploy-9.9.dist-info"
    di.mkdir(parents=True)
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: ddtree-deploy\nVersion: 9.9\n"
                                 "Requires-Dist: packaging>=1\nRequires-Dist: no-such-pkg>=1\n"
                                 "Requires-Dist: paramiko>=3\n")
    (site / "ddtree_deploy").mkdir()
    (site / "ddtree_deploy" / "cli.py").write_text("")
    out = subprocess.run([sys.executable, "-c", carry._CHECK, str(site), '["paramiko"]'],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["no-such-pkg>=1: not installed"]


# -- the committed carry set -----------------------------------------------------------------


def test_parse_errors_name_the_line_and_field() -> None:
    with pytest.raises(CarryError, match="x.tsv, line 1: expected the header"):
        parse_carry_set("name\tversion\n", "x.tsv")
    with pytest.raises(CarryError, match="x.tsv, line 2: expected 9 tab-separated fields"):
        parse_carry_set(HEADER + "\na\tb\n", "x.tsv")
    row = "a\t1\tvenv\t-\t1\t1\t{}\ta-1-py3-none-any.whl\twhy"
    with pytest.raises(CarryError, match="line 2: field 'sha256' must be 64 lowercase hex"):
        parse_carry_set(HEADER + "\n" + row.format("ABC"), "x.tsv")
    with pytest.raises(CarryError, match="line 3: a is listed twice"):
        parse_carry_set(HEADER + "\n" + row.format("a" * 64) + "\n" + row.format("b" * 64), "x")


def test_committed_carry_set_is_locked_fits_and_covers_the_tools_requirements() -> None:
    entries = load_carry_set(CARRY_SET)
    carried = [e for e in entries if e.carried_here]
    assert carry.unlocked(entries) == []
    pins = {e.name: e.version for e in entries}
    assert pins["sglang"] == "0.5.11" and pins["sglang_kernel"] == "0.4.2"
    assert pins["transformers"] == "5.6.0" and pins["tokenizers"] == "0.22.2"
    assert pins["flashinfer_python"] == "0.6.8.post1"
    for e in carried:  # what the H200 host's Python 3.12 on x86-64 Linux can install
        tags = e.filename[:-4].split("-")[-3:]
        assert tags[0] in ("py3", "py2.py3", "cp312") or tags[1] == "abi3", e.filename
        assert tags[2] == "any" or "x86_64" in tags[2], e.filename
    assert [e.name for e in carried if e.repack] == ["sglang_kernel"]
    assert sum(e.carried for e in carried) < LIMIT_BYTES - 4 * MIB  # room for the tree
    # every runtime requirement of the tool is carried, on the host already, or skipped with why
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    known = {canonicalize_name(e.name) for e in entries} | set(HOST_HAS)
    missing = [r for r in project["dependencies"]
               if canonicalize_name(Requirement(r).name) not in known]
    assert missing == []
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    locked = {p["name"]: p["version"] for p in lock["package"]}
    for e in entries:  # the tool's own requirements are pinned as uv.lock pins them
        if canonicalize_name(e.name) in {canonicalize_name(Requirement(r).name)
                                         for r in project["dependencies"]}:
            assert locked[canonicalize_name(e.name)] == e.version, e.name


def test_keep_and_strip_options_of_a_profile(tmp_path: Path) -> None:
    """transformers-text keeps the listed model folders only; xgrammar-strip strips shared
    objects (a real one: this Python's _ctypes extension) and writes their new hash in RECORD."""
    from rehearsal.carry_repack import repack_profile

    models = {"transformers/models/qwen3/config.py": b"q3\n",
              "transformers/models/bert/config.py": b"bert\n",
              "transformers/models/__init__.py": b"\n", "transformers/__init__.py": b"\n"}
    res = repack_profile(make_wheel(tmp_path / "tf", "transformers", "5.12.1", models),
                         tmp_path / "tf-out", "transformers-text")
    with zipfile.ZipFile(res.path) as zf:
        assert set(zf.namelist()) >= {"transformers/models/qwen3/config.py",
                                      "transformers/models/__init__.py"}
        assert "transformers/models/bert/config.py" not in zf.namelist()
    assert res.dropped == ("transformers/models/bert/config.py",)
    import _ctypes

    so = Path(_ctypes.__file__).read_bytes()
    xg = make_wheel(tmp_path / "xg", "xgrammar", "0.2.1",
                    {"xgrammar/libxgrammar_bindings.so": so, "xgrammar/lib/libxgrammar.a": b"!",
                     "xgrammar/__init__.py": b"\n"})
    res = repack_profile(xg, tmp_path / "xg-out", "xgrammar-strip")
    assert res.dropped == ("xgrammar/lib/libxgrammar.a",)
    with zipfile.ZipFile(res.path) as zf:
        stripped = zf.read("xgrammar/libxgrammar_bindings.so")
    assert stripped[:4] == b"\x7fELF" and len(stripped) <= len(so)
    assert record_problems(res.path) == []
