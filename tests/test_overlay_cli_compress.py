"""`overlay --compress auto|always|never`: the option reaches the streams' choice.

The whole CLI as a subprocess over local transports (two "hosts" of hosts.yaml with
`transport: local`, their venvs folders of this machine), a lane file of one small
distribution with a real RECORD: the command's `--json` names the choice it made and why,
and the target gets the files whatever the choice. A bad value is a usage error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
CLI = [sys.executable, "-c", "from ddtree_deploy.cli.app import main; main()"]


def _venv(root: Path) -> Path:
    site = root / "lib" / PY / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    return site


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _install_dist(site: Path, files: dict[str, bytes]) -> None:
    info = "demo_lib-1.0.dist-info"
    files = {**files, f"{info}/METADATA": b"Metadata-Version: 2.1\nName: demo-lib\n"
                                          b"Version: 1.0\n"}
    rows = [f"{p},sha256={_b64(d)},{len(d)}" for p, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(rows) + "\n").encode()
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)


def _setup(tmp: Path) -> tuple[list[str], dict[str, str], Path]:
    src = tmp / "src-venv"
    site = _venv(src)
    rng = random.Random(11)
    _install_dist(site, {"demo_lib/__init__.py": b"ok = True\n",
                         "demo_lib/libdemo.so": rng.randbytes(3 << 20),
                         "demo_lib/table.txt": b"cuda kernel table\n" * 50_000})
    dst = tmp / "dst-venv"
    _venv(dst)
    lane = tmp / "demo.yaml"
    lane.write_text(f"lane: demo\nsource:\n  host: src\n  venv: {src}\n"
                    "distributions:\n  - demo-lib\nchecks:\n  imports:\n    - demo_lib\n")
    hosts = tmp / "hosts.yaml"
    hosts.write_text("version: 1\nhosts:\n  src:\n    transport: local\n"
                     "  dst:\n    transport: local\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"),
           "XDG_STATE_HOME": str(tmp / "state"), "XDG_CONFIG_HOME": str(tmp / "cfg")}
    argv = [*CLI, "--hosts", str(hosts), "overlay", "--abi", str(lane), "--to", f"dst:{dst}",
            "--json"]
    return argv, env, dst / "lib" / PY / "site-packages"


@pytest.mark.integration  # the CLI as a subprocess, venvs
@pytest.mark.parametrize("mode", ["never", "always"])
def test_the_compress_option_reaches_the_streams_choice(tmp_path: Path, mode: str) -> None:
    if mode == "always" and shutil.which("zstd") is None:
        pytest.skip("zstd is needed for a compressed stream")
    argv, env, site = _setup(tmp_path)
    proc = subprocess.run([*argv, "--compress", mode], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)["results"]  # docs/json.md
    assert out["result"] == "applied", out
    assert out["source_compression"]["reason"] == f"--compress {mode}"
    assert out["source_compression"]["compress"] is (mode == "always")
    assert out["fetch"]["compressed"] is (mode == "always")
    assert (site / "demo_lib" / "table.txt").read_bytes() == b"cuda kernel table\n" * 50_000
    if mode == "always":  # the text file shrinks: fewer bytes on the wire than its payload
        assert out["fetch"]["wire"] < out["fetch"]["payload"]


@pytest.mark.integration
def test_auto_measures_and_says_what_compressing_would_cost(tmp_path: Path) -> None:
    if shutil.which("zstd") is None:
        pytest.skip("zstd is needed for the source's sample")
    argv, env, site = _setup(tmp_path)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)  # no --compress: auto
    assert proc.returncode == 0, proc.stderr
    choice = json.loads(proc.stdout)["results"]["source_compression"]
    assert choice["reason"] != "--compress auto" and choice["ratio"] > 1
    assert choice["cpu_s_per_gb"] > 0 and choice["spare_cores"] >= 1
    assert (site / "demo_lib" / "libdemo.so").stat().st_size == 3 << 20


@pytest.mark.integration
def test_a_bad_compress_value_is_a_usage_error(tmp_path: Path) -> None:
    argv, env, site = _setup(tmp_path)
    proc = subprocess.run([*argv, "--compress", "sometimes"], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert "--compress 'sometimes': expected one of auto, always, never" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    report = json.loads(proc.stdout)  # --json: the error as data too (README, exit codes)
    assert report["exit_code"] == 2 and "--compress 'sometimes'" in report["error"]["message"]
    assert not (site / "demo_lib").exists() and not (tmp_path / "cache").exists()
