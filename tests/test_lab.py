"""The lab as the README promises it: real systemd/sshd hosts, isolation, GPU stand-ins, servers.

Runs against the real containers (root, systemd-nspawn). Every remote command
goes through the tool's own SSH transport with the lab's key and known_hosts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport
from ddtree_lab import container, manager, netns, wheelhouse

pytestmark = pytest.mark.lab

MODEL = "/dev/shm/Qwen3.6-27B"
DRAFT = "/dev/shm/Qwen3.6-27B-DFlash-b16"


def sh(config: Config, host: str, script: str, *args: str, timeout: float = 60):
    with open_transport(config, host) as t:
        return t.run(Command.shell(script, *args), timeout=timeout)


def compute_apps(config: Config, host: str) -> list[list[str]]:
    r = sh(config, host, "nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory "
                         "--format=csv,noheader,nounits")
    assert r.ok, r.stderr
    return [[f.strip() for f in line.split(",")] for line in r.stdout.splitlines() if line.strip()]


def gpu_index_of(config: Config, host: str) -> dict[str, str]:
    r = sh(config, host, "nvidia-smi --query-gpu=uuid,index --format=csv,noheader")
    return dict((u.strip(), i.strip()) for u, i in (ln.split(",") for ln in r.stdout.splitlines()))


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_ssh_into_each_host_with_lab_key(lab: Config) -> None:
    for host in ("ct129", "ct200"):
        r = sh(lab, host, 'hostname; systemctl is-system-running; journalctl -q -n 1 -o cat '
                          '--no-pager >/dev/null && echo journal-ok; id -u')
        lines = r.stdout.split()
        assert r.ok, r.stderr
        assert lines[0] == host
        assert lines[1] in ("running", "degraded")
        assert "journal-ok" in lines and lines[-1] == "0"


def test_hosts_cannot_reach_each_other_or_the_internet(lab: Config) -> None:
    probe = ("import socket,sys\n"
             "try:\n socket.create_connection((sys.argv[1], 22), timeout=3)\n"
             "except OSError as e:\n print('FAILED', e); sys.exit(3)\nprint('CONNECTED')\n")
    r = sh(lab, "ct129", 'python3 -c "$1" "$2"', probe, lab.host("ct200").address)
    assert r.exit_code == 3 and "FAILED" in r.stdout, r.stdout + r.stderr
    r = sh(lab, "ct200", 'python3 -c "$1" "$2"', probe, lab.host("ct129").address)
    assert r.exit_code == 3 and "FAILED" in r.stdout
    routes = sh(lab, "ct129", "ip route show default").stdout.strip()
    assert routes == ""


def test_gpu_layer_matches_the_story(lab: Config) -> None:
    r = sh(lab, "ct129", "nvidia-smi --query-gpu=index,name,memory.total,compute_cap "
                         "--format=csv,noheader")
    assert r.stdout.splitlines() == [
        "0, NVIDIA RTX A6000, 49140 MiB, 8.6",
        "1, NVIDIA RTX A6000, 49140 MiB, 8.6",
    ]
    r = sh(lab, "ct200", "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader")
    assert r.stdout.splitlines() == ["NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0"] * 8
    r = sh(lab, "ct129", "nvidia-smi -i 7")
    assert r.exit_code == 6 and "No devices were found" in r.stdout + r.stderr


def test_gpu0_on_ct200_is_held_by_the_wrapper_unit(lab: Config) -> None:
    main_pid = sh(lab, "ct200", "systemctl show -p MainPID --value qwen-wrapper").stdout.strip()
    assert main_pid.isdigit() and main_pid != "0"
    index = gpu_index_of(lab, "ct200")
    apps = compute_apps(lab, "ct200")
    assert [(a[0], index[a[1]]) for a in apps] == [(main_pid, "0")]
    # The wrapper listens on port 30000 (0x7530) like the story's server.
    tcp = sh(lab, "ct200", "cat /proc/net/tcp /proc/net/tcp6").stdout
    assert any(":7530 " in ln and " 0A " in ln for ln in tcp.splitlines())
    assert http_get(f"http://{lab.host('ct200').address}:30000/health")[0] == 200
    try:
        assert sh(lab, "ct200", "systemctl stop qwen-wrapper").ok
        assert compute_apps(lab, "ct200") == []
    finally:
        assert sh(lab, "ct200", "systemctl start qwen-wrapper").ok
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not compute_apps(lab, "ct200"):
        time.sleep(0.5)
    assert len(compute_apps(lab, "ct200")) == 1


def launch(venv: str, *flags: str, gpu: str = "0") -> str:
    """A shell line that starts the lab's server from `venv` in the foreground."""
    return (f"CUDA_VISIBLE_DEVICES={gpu} timeout 60 {venv}/bin/python -m sglang.launch_server "
            f"--model-path {MODEL} --host 0.0.0.0 --port 30100 " + " ".join(flags))


def test_first_attempt_venv_fails_on_its_first_broken_part(lab: Config) -> None:
    # /root/venv_sglang: PyPI sglang 0.5.10 (no DFlash), flashinfer 0.6.3, xgrammar 0.1.10,
    # no soundfile. Asked for DFlash, it fails at the first check: 0.5.10's own argument
    # parser (read from its real server_args.py) does not know the algorithm.
    r = sh(lab, "ct200", launch("/root/venv_sglang", "--speculative-algorithm", "DFLASH",
                                "--speculative-draft-model-path", DRAFT, gpu="1"))
    assert r.exit_code == 2
    assert "argument --speculative-algorithm: invalid choice: 'DFLASH'" in r.stderr
    # Without speculative decoding the next broken part shows: no sgl_kernel at all.
    r = sh(lab, "ct200", launch("/root/venv_sglang", gpu="1"))
    assert r.exit_code == 1
    assert "Traceback (most recent call last)" in r.stderr
    assert "No module named 'sgl_kernel'" in r.stderr


def _push_wheels(lab: Config, host: str, wanted: list[str]) -> list[str]:
    cache = manager.lab_cache_dir() / "wheels"
    real = wheelhouse.download_real(cache / "real")
    wheels = {**real, **wheelhouse.build_standins(cache / "standin", real)}
    remote = []
    with open_transport(lab, host) as t:
        t.run(Command.of("mkdir", "-p", "/tmp/lab-wheels")).check()
        for path in wheelhouse.expand(tuple(wanted), wheels):
            with open(path, "rb") as fh:
                t.put_stream(fh, f"/tmp/lab-wheels/{path.name}")
            remote.append(f"/tmp/lab-wheels/{path.name}")
    return remote


def test_cu128_torch_with_cuda13_kernel_fails_with_the_loader_error(lab: Config) -> None:
    # The story's venv_sglang211 before its overlay: a clone of the cu128 training venv
    # with the DFlash-capable sglang and sgl_kernel built for CUDA 13 copied in.
    files = _push_wheels(lab, "ct200", ["sglang==0.5.11", "standin:sglang-kernel",
                                        "soundfile==0.13.1", "cffi==2.0.0", "pycparser==2.23",
                                        "standin:lab-server"])
    setup = ("rm -rf /root/venv_mix && cp -a /root/venv /root/venv_mix && "
             "sed -i 's#/root/venv/#/root/venv_mix/#' /root/venv_mix/bin/pip && "
             "/root/venv_mix/bin/python -m pip install -q --no-index --no-deps "
             "--disable-pip-version-check \"$@\"")
    assert sh(lab, "ct200", setup, *files, timeout=120).ok
    try:
        r = sh(lab, "ct200", launch("/root/venv_mix", "--attention-backend", "triton", gpu="1"))
        assert r.exit_code == 1
        assert "cannot open shared object file: No such file or directory" in r.stderr
        assert ".so.13" in r.stderr  # a CUDA 13 library, absent from a cu128 venv
    finally:
        sh(lab, "ct200", "rm -rf /root/venv_mix /tmp/lab-wheels")


def test_dead_gpu_fails_with_devices_unavailable(lab: Config) -> None:
    r = sh(lab, "ct129", launch("/root/ml-env", "--attention-backend", "triton", gpu="1"))
    assert r.exit_code == 1
    assert "busy or unavailable" in r.stderr


def test_working_venv_serves_health_and_holds_its_gpu(lab: Config) -> None:
    address = lab.host("ct129").address
    start = ("systemd-run --unit=lab-test-server --collect -p Environment=CUDA_VISIBLE_DEVICES=0 "
             "/root/ml-env/bin/python -m sglang.launch_server --model-path \"$1\" "
             "--attention-backend triton --host 0.0.0.0 --port 30100")
    assert sh(lab, "ct129", start, MODEL).ok
    try:
        pid = sh(lab, "ct129", "systemctl show -p MainPID --value lab-test-server").stdout.strip()
        status, body = 0, ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                status, body = http_get(f"http://{address}:30100/health")
            except OSError:
                status = 0
            if status == 200:
                break
            time.sleep(0.3)
        assert status == 200, body
        index = gpu_index_of(lab, "ct129")
        assert [(a[0], index[a[1]]) for a in compute_apps(lab, "ct129")] == [(pid, "0")]
        status, body = http_get(f"http://{address}:30100/v1/models")
        assert status == 200 and MODEL in body
    finally:
        sh(lab, "ct129", "systemctl stop lab-test-server")
    assert compute_apps(lab, "ct129") == []


def test_up_clears_leftovers_of_a_killed_run_and_down_leaves_nothing(lab: Config) -> None:
    state = json.loads((manager.lab_state_dir() / "state.json").read_text())
    for h in state["hosts"]:  # a killed run: containers die, mounts and namespaces stay
        os.kill(h["pid"], signal.SIGKILL)
    time.sleep(1)
    assert netns.stale(), "namespaces should survive the kill"
    hosts = manager.up(link_rate="1gbit")
    assert all(r.running and r.ssh for r in manager.status())
    for h in hosts:  # shaped both ways: the workstation's veth and host0 in the namespace
        assert netns.shaped_rate(None, h.veth) == netns.shaped_rate(h.netns, "host0") == "1Gbit"
    hosts = manager.up()  # the next up leaves the links as the kernel makes them
    assert [netns.shaped_rate(None, h.veth) for h in hosts] == [None] * len(hosts)
    assert [netns.shaped_rate(h.netns, "host0") for h in hosts] == [None] * len(hosts)
    manager.down()
    run_root = manager.lab_state_dir() / "run"
    assert netns.stale() == []
    assert container.mounts_under(run_root) == []
    assert container.mounts_under(manager.lab_cache_dir()) == []
    assert container.nspawn_pids_for(run_root) == []
    assert container.orphan_inits() == []  # the killed run's container inits are gone too
    assert not run_root.exists()
    assert not Path("/sys/class/net/ddtl-ct129").exists()
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    assert "10.77." not in routes


def test_a_second_lab_up_from_another_process_tree_is_refused(lab: Config, tmp_path: Path) -> None:
    # A benchmark started while a test session runs once tore the session's containers down.
    # This session holds the lab (conftest), so an outside `lab up` is refused, naming us.
    before = {h.name: h.pid for h in manager.status()}
    cli = str(Path(sys.executable).with_name("ddtree-deploy"))
    out, rc = tmp_path / "out", tmp_path / "rc"
    # Detached (its parent shell exits at once): not a descendant of this session.
    subprocess.run(["sh", "-c", '("$1" lab up >"$2" 2>&1; echo $? >"$3.tmp"; mv "$3.tmp" "$3") '
                                '</dev/null >/dev/null 2>&1 &', "sh", cli, str(out), str(rc)],
                   check=True)
    deadline = time.monotonic() + 120
    while not rc.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rc.read_text().strip() == "1", out.read_text()
    assert f"PID {os.getpid()}" in out.read_text() and "Traceback" not in out.read_text()
    assert {h.name: h.pid for h in manager.status() if h.running} == before
