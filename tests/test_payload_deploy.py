"""payload deploy / verify / rollback against REAL sglang wheels in scratch venvs (local transport).

The venvs hold the registry's sglang installed with --no-deps (no torch): verify loads
the light modules by their files and says it skipped the full import.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import wheelcache

from ddtree_deploy.errors import ConfigError, RefusedError
from ddtree_deploy.payload import deploy as ops
from ddtree_deploy.payload.manifest import load_manifest
from ddtree_deploy.resources import data_path
from ddtree_deploy.transport.local import LocalTransport


def scratch_venv(root: Path, wheel: Path) -> Path:
    venv = root / wheel.name.split("-")[1]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-compile", "--target", str(site), str(wheel)], check=True)
    return venv


def tree_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheels() -> dict[str, Path]:
    return {f"sglang=={v}": wheelcache.wheel("sglang", v)  # tests/wheels.toml
            for v in ("0.5.10", "0.5.11")}


def test_deploy_verify_rollback_is_byte_exact(tmp_path: Path, wheels: dict[str, Path]) -> None:
    venv = scratch_venv(tmp_path, wheels["sglang==0.5.11"])
    pkg = next((venv / "lib").glob("python3.*/site-packages")) / "sglang"
    before = tree_hashes(pkg)
    manifest, folder = load_manifest(data_path("payload"))
    with LocalTransport() as t:
        out = ops.deploy(t, str(venv), manifest, folder)
        assert out.action == "deployed" and out.sglang == "0.5.11"
        checks = {c.name: c for c in out.checks}
        assert all(c.status in ("passed", "skipped") for c in checks.values())
        assert any(c.status == "passed" and c.mode == "light" for c in checks.values())
        assert all(c.status == "skipped" and "torch" in c.detail
                   for c in checks.values() if c.mode == "full")
        during = tree_hashes(pkg)
        assert during != before
        assert {k for k in during if k not in before}  # the payload's new modules
        again = ops.deploy(t, str(venv), manifest, folder)
        assert again.action == "unchanged"
        back = ops.rollback(t, str(venv))
        assert back.action == "rolled back"
        assert tree_hashes(pkg) == before
        assert ops.rollback(t, str(venv)).action == "nothing to roll back"


def test_deploy_clears_stale_pycache(tmp_path: Path, wheels: dict[str, Path]) -> None:
    venv = scratch_venv(tmp_path, wheels["sglang==0.5.11"])
    pkg = next((venv / "lib").glob("python3.*/site-packages")) / "sglang"
    cache = pkg / "srt/speculative/__pycache__"
    cache.mkdir(exist_ok=True)
    stale = cache / "spec_info.cpython-311.pyc"
    stale.write_bytes(b"stale")
    manifest, folder = load_manifest(data_path("payload"))
    with LocalTransport() as t:
        ops.deploy(t, str(venv), manifest, folder)
        assert not stale.exists()
        stale.write_bytes(b"stale again")
        ops.rollback(t, str(venv))
        assert not stale.exists()


def test_sglang_0510_without_dflash_is_refused(tmp_path: Path, wheels: dict[str, Path]) -> None:
    venv = scratch_venv(tmp_path, wheels["sglang==0.5.10"])
    manifest, folder = load_manifest(data_path("payload"))
    with LocalTransport() as t, pytest.raises(RefusedError) as info:
        ops.deploy(t, str(venv), manifest, folder)
    assert "does not support sglang 0.5.10" in str(info.value)
    assert "0.5.11" in str(info.value)


def test_a_changed_upstream_file_is_refused_naming_it(tmp_path: Path,
                                                      wheels: dict[str, Path]) -> None:
    venv = scratch_venv(tmp_path, wheels["sglang==0.5.11"])
    manifest, folder = load_manifest(data_path("payload"))
    target = manifest.sglang["0.5.11"].patches[0].target
    pkg = next((venv / "lib").glob("python3.*/site-packages")) / "sglang"
    (pkg / target).write_text((pkg / target).read_text() + "\n# edited by hand\n")
    with LocalTransport() as t, pytest.raises(RefusedError) as info:
        ops.deploy(t, str(venv), manifest, folder)
    text = str(info.value)
    assert target in text and manifest.sglang["0.5.11"].patches[0].sha256 in text
    assert "0.5.11" in text


def test_a_users_own_payload_folder_with_the_same_manifest_format(
        tmp_path: Path, wheels: dict[str, Path]) -> None:
    import shutil

    own = tmp_path / "my-payload"
    shutil.copytree(data_path("payload"), own)
    text = (own / "payload.yaml").read_text()
    mine = re.sub(r'(?m)^version: ".*"$', 'version: "9.9.9-mine"', text, count=1)
    assert mine != text
    (own / "payload.yaml").write_text(mine)
    venv = scratch_venv(tmp_path, wheels["sglang==0.5.11"])
    manifest, folder = load_manifest(own)
    assert manifest.version == "9.9.9-mine" and folder == own
    with LocalTransport() as t:
        out = ops.deploy(t, str(venv), manifest, folder)
        assert out.payload == "9.9.9-mine"
        assert ops.status(t, [str(venv)])[str(venv)]["version"] == "9.9.9-mine"
        ops.rollback(t, str(venv))
    broken = tmp_path / "broken"
    shutil.copytree(own, broken)
    (broken / "payload.yaml").write_text("payload: ddtree\nversion: 1\nsglang: []\n")
    with pytest.raises(ConfigError) as info:
        load_manifest(broken)
    assert "payload.yaml:3: sglang" in str(info.value)
