"""service up/down and probe in the lab: refusals, a healthy service, and each crash of the story
reproduced by changing real packages in a venv, diagnosed by the probe's signatures."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport
from ddtree_lab import manager, wheelhouse

pytestmark = pytest.mark.lab
ML_ENV = "/root/ml-env"


def cli(lab: Config, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(lab.path),
                           *args], capture_output=True, text=True, timeout=timeout, check=False)


def sh(lab: Config, host: str, script: str, *args: str, timeout: float = 120) -> str:
    with open_transport(lab, host) as t:
        r = t.run(Command.shell(script, *args), timeout=timeout)
    assert r.ok, f"{script}: {r.stderr}"
    return r.stdout


def compute_pids(lab: Config, host: str) -> list[str]:
    out = sh(lab, host, "nvidia-smi --query-compute-apps=pid --format=csv,noheader")
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


@pytest.fixture()
def cleanup(lab: Config) -> Iterator[list[tuple[str, str]]]:
    """Services (host, name) a test started; each is taken down and removed afterwards."""
    started: list[tuple[str, str]] = []
    yield started
    for host, name in started:
        cli(lab, "service", "down", host, name, "--remove")


def probe_json(lab: Config, host: str, name: str, deadline: str = "60") -> dict:
    r = cli(lab, "probe", host, name, "--json", "--deadline", deadline)
    doc = json.loads(r.stdout)  # docs/json.md: the verdict is the results
    verdict: dict = doc["results"]
    assert r.returncode == verdict["exit_code"] == doc["exit_code"]
    return verdict


def up_and_probe(lab: Config, cleanup: list, host: str, name: str, *flags: str) -> dict:
    cleanup.append((host, name))
    r = cli(lab, "service", "up", host, "--name", name, "--no-probe", *flags)
    assert r.returncode == 0, r.stderr
    return probe_json(lab, host, name)


def diagnosis_ids(verdict: dict) -> set[str]:
    return {m["id"] for m in verdict["diagnosis"]}


def test_dflash_service_on_ct129_gpu0_is_healthy(lab: Config, cleanup: list) -> None:
    cleanup.append(("ct129", "sglang-dflash"))
    r = cli(lab, "service", "up", "ct129", "--gpu", "0", "--venv", ML_ENV,
            "--algorithm", "dflash")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "healthy" in r.stdout
    unit = sh(lab, "ct129", "cat /etc/systemd/system/sglang-dflash.service")
    assert "X-DDTreeDeploy-Managed=yes" in unit and "CUDA_VISIBLE_DEVICES=0" in unit
    assert "nvidia/cu13/lib" in unit  # LD_LIBRARY_PATH from the venv's real folders
    main_pid = sh(lab, "ct129", "systemctl show -p MainPID --value sglang-dflash").strip()
    assert compute_pids(lab, "ct129") == [main_pid]
    listed = json.loads(cli(lab, "service", "list", "ct129", "--json").stdout)["results"]
    assert [s["unit"] for s in listed] == ["sglang-dflash.service"]
    assert cli(lab, "service", "down", "ct129", "sglang-dflash").returncode == 0
    assert compute_pids(lab, "ct129") == []


def test_dead_gpu_is_refused(lab: Config) -> None:
    r = cli(lab, "service", "up", "ct129", "--gpu", "1", "--venv", ML_ENV)
    assert r.returncode == 1 and "GPU 1 on ct129 is dead" in r.stderr
    assert "Traceback" not in r.stderr


def test_busy_gpu0_on_ct200_is_refused_and_the_wrapper_keeps_running(lab: Config) -> None:
    holder = sh(lab, "ct200", "systemctl show -p MainPID --value qwen-wrapper").strip()
    r = cli(lab, "service", "up", "ct200", "--gpu", "0", "--venv", "/root/venv")
    assert r.returncode == 1
    assert f"PID {holder}" in r.stderr and "30000" in r.stderr
    assert cli(lab, "service", "down", "ct200", "qwen-wrapper").returncode == 1
    assert sh(lab, "ct200", "systemctl is-active qwen-wrapper").strip() == "active"
    assert compute_pids(lab, "ct200") == [holder]


def _wheels() -> dict[str, Path]:
    cache = manager.lab_cache_dir() / "wheels"
    real = wheelhouse.download_real(cache / "real")
    return {**real, **wheelhouse.build_standins(cache / "standin", real)}


def _push(lab: Config, host: str, entries: list[str]) -> list[str]:
    wheels, remote = _wheels(), []
    with open_transport(lab, host) as t:
        t.run(Command.of("mkdir", "-p", "/tmp/lab-wheels")).check()
        for path in wheelhouse.expand(tuple(entries), wheels):
            with open(path, "rb") as fh:
                t.put_stream(fh, f"/tmp/lab-wheels/{path.name}")
            remote.append(f"/tmp/lab-wheels/{path.name}")
    return remote


def _copy_venv(lab: Config, host: str, src: str, dst: str) -> None:
    sh(lab, host, 'rm -rf "$2" && cp -a "$1" "$2"', src, dst)


def test_soundfile_removed(lab: Config, cleanup: list) -> None:
    _copy_venv(lab, "ct129", ML_ENV, "/root/env-nosf")
    sh(lab, "ct129", "/root/env-nosf/bin/python -m pip uninstall -q -y soundfile")
    v = up_and_probe(lab, cleanup, "ct129", "crash-nosf", "--gpu", "0", "--venv",
                     "/root/env-nosf", "--attention-backend", "triton")
    assert v["status"] == "unhealthy" and "soundfile-missing" in diagnosis_ids(v)


def test_old_xgrammar(lab: Config, cleanup: list) -> None:
    _copy_venv(lab, "ct129", ML_ENV, "/root/env-oldxg")
    files = _push(lab, "ct129", ["xgrammar==0.1.10"])
    sh(lab, "ct129", '/root/env-oldxg/bin/python -m pip install -q --no-deps --no-index '
                     '--force-reinstall "$@"', *files)
    v = up_and_probe(lab, cleanup, "ct129", "crash-oldxg", "--gpu", "0", "--venv",
                     "/root/env-oldxg", "--attention-backend", "triton",
                     "--grammar-backend", "xgrammar")
    assert v["status"] == "unhealthy" and "xgrammar-no-structural-tag" in diagnosis_ids(v)


def test_sm120_with_flashinfer(lab: Config, cleanup: list) -> None:
    # A copy of ct129's ml-env on ct200, carried through the workstation (tar out, tar in).
    import io

    with open_transport(lab, "ct129") as src:
        buf = io.BytesIO()
        src.run_stream_out(Command.of("tar", "-C", "/root", "-cf", "-", "ml-env"), buf).check()
    buf.seek(0)
    with open_transport(lab, "ct200") as dst:
        dst.run(Command.shell('rm -rf /root/ml-env && mkdir -p /root')).check()
        dst.run_stream_in(Command.of("tar", "-C", "/root", "-xf", "-"), buf).check()
    try:
        v = up_and_probe(lab, cleanup, "ct200", "crash-sm120", "--gpu", "1", "--venv",
                         ML_ENV, "--attention-backend", "flashinfer", "--grammar-backend", "none")
        assert v["status"] == "unhealthy" and "flashinfer-sm12-guard" in diagnosis_ids(v)
    finally:
        sh(lab, "ct200", "rm -rf /root/ml-env")


def test_cuda13_kernel_in_a_cu128_venv(lab: Config, cleanup: list) -> None:
    files = _push(lab, "ct200", ["sglang==0.5.11", "standin:sglang-kernel", "soundfile==0.13.1",
                                 "cffi==2.0.0", "pycparser==2.23", "standin:lab-server"])
    _copy_venv(lab, "ct200", "/root/venv", "/root/env-mix")
    sh(lab, "ct200", '/root/env-mix/bin/python -m pip install -q --no-deps --no-index "$@"',
       *files)
    v = up_and_probe(lab, cleanup, "ct200", "crash-abi", "--gpu", "2", "--venv", "/root/env-mix",
                     "--attention-backend", "triton", "--grammar-backend", "none")
    assert v["status"] == "unhealthy" and "abi-missing-cuda-library" in diagnosis_ids(v)
    assert any("overlay" in m["remedy"] for m in v["diagnosis"])


def test_dead_gpu_crash(lab: Config, cleanup: list) -> None:
    cleanup.append(("ct129", "crash-dead"))
    r = cli(lab, "service", "up", "ct129", "--name", "crash-dead", "--gpu", "1", "--force",
            "--venv", ML_ENV, "--attention-backend", "triton", "--no-probe")
    assert r.returncode == 0, r.stderr
    v = probe_json(lab, "ct129", "crash-dead")
    assert v["status"] == "unhealthy" and "gpu-unavailable" in diagnosis_ids(v)


def test_port_already_taken(lab: Config, cleanup: list) -> None:
    sh(lab, "ct129", "systemd-run --unit=lab-squatter --collect python3 -m http.server 30123")
    try:
        cleanup.append(("ct129", "crash-port"))
        r = cli(lab, "service", "up", "ct129", "--name", "crash-port", "--gpu", "0", "--port",
                "30123", "--force", "--venv", ML_ENV, "--attention-backend", "triton",
                "--no-probe")
        assert r.returncode == 0, r.stderr
        v = probe_json(lab, "ct129", "crash-port")
        assert v["status"] == "unhealthy" and "port-in-use" in diagnosis_ids(v)
    finally:
        sh(lab, "ct129", "systemctl stop lab-squatter || true")
