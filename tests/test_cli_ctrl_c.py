"""Ctrl-C in a command that waits on hosts: the CLI stops at once, says so, and keeps --json's
promise (conventions: SIGINT exits 130 without a traceback; stdout one JSON document).

Two hosts on a loopback port that accepts connections and never answers (no SSH banner), with
a connect timeout of an hour: the CLI is stuck in both connects when SIGINT comes, as from a
terminal. Before, typer turned the KeyboardInterrupt into a silent exit 130 (no line on
stderr, no document under --json), and only after the thread pool had waited out every host
(here an hour: the hang guard fails it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from foreground import sigint_default
from hang_guard import HANG_GUARD_S


def _hosts(tmp_path: Path, port: int) -> Path:
    host = (f"    address: 127.0.0.1\n    port: {port}\n    connect_timeout: 3600\n"
            f"    ssh_persist: 0\n    venvs:\n      v: {{path: /root/v, role: serving}}\n"
            f"    models: {{default: /root/m}}\n")
    path = tmp_path / "hosts.yaml"
    path.write_text(f"version: 1\nhosts:\n  mute1:\n{host}  mute2:\n{host}deployments:\n"
                    "  d1: {host: mute1, venv: v, cuda_lane: cu130, sglang: {version: 0.5.11}}\n"
                    "  d2: {host: mute2, venv: v, cuda_lane: cu130, sglang: {version: 0.5.11}}\n")
    return path


OVERLAY = ["overlay", "--abi", "cu130", "--from", "mute1", "--from-venv", "/root/v",
           "--to", "mute2:/root/w", "--to", "mute1:/root/x", "--json"]


@pytest.mark.parametrize("args", [["plan", "--json"], ["hosts", "check"], ["inventory", "--json"],
                                  OVERLAY],
                         ids=["plan-json", "hosts-check", "inventory-json", "overlay-json"])
def test_ctrl_c_while_hosts_do_not_answer(tmp_path: Path,
                                          mute_port: tuple[int, list[socket.socket]],
                                          args: list[str]) -> None:
    port, taken = mute_port
    env = {**os.environ, "NO_COLOR": "1", "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "DDTREE_DEPLOY_HOSTS": ""}
    argv = [sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(_hosts(tmp_path, port)),
            *args]
    proc = subprocess.Popen(sigint_default(argv), cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + HANG_GUARD_S
        while len(taken) < 2 and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)  # both hosts are being connected to
        assert len(taken) >= 2, proc.poll()  # (overlay: the source too)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=HANG_GUARD_S)  # a hang guard, not a bound
        except subprocess.TimeoutExpired:
            pytest.fail("hang guard: Ctrl-C did not end the command (it waits on the hosts)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text
    assert text.splitlines()[-1] == "interrupted"
    if "--json" in args:
        doc = json.loads(out)
        assert doc["ok"] is False and doc["exit_code"] == 130, doc
        assert doc["error"]["message"].startswith("interrupted")
    else:
        assert "unreachable" not in out.decode()


def test_ctrl_c_at_apply_s_question(tmp_path: Path) -> None:
    """Ctrl-C at "Apply to ...? [y/N]" (a terminal) is 130 and "interrupted", as anywhere
    else, and nothing else; typer said "Aborted." and exited 1, as for a "no" (then "Aborted."
    before "interrupted")."""
    import pty
    import select

    host = ("    address: 127.0.0.1\n    port: 1\n    ssh_persist: 0\n    venvs:\n"
            "      v: {path: /root/v, role: serving}\n    models: {default: /root/m}\n")
    hosts = tmp_path / "hosts.yaml"
    # two hosts (one that cannot be planned is its error, with no question)
    hosts.write_text(f"version: 1\nhosts:\n  closed:\n{host}  shut:\n{host}deployments:\n"
                     "  d: {host: closed, venv: v, cuda_lane: cu130, sglang: {version: 0.5.11}}\n"
                     "  e: {host: shut, venv: v, cuda_lane: cu130, sglang: {version: 0.5.11}}\n")
    env = {**os.environ, "NO_COLOR": "1", "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "DDTREE_DEPLOY_HOSTS": ""}
    argv = sigint_default([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts),
                           "apply", "closed", "shut"])
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on a terminal
        os.chdir(tmp_path)
        os.execvpe(argv[0], argv, env)
    seen = b""
    asked = False
    try:
        end = time.monotonic() + HANG_GUARD_S  # a hang guard, not a bound
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child is gone
                break
            if not chunk:
                break
            seen += chunk
            if not asked and b"Apply to closed, shut?" in seen:
                os.write(fd, b"\x03")  # Ctrl-C, as the terminal sends it
                asked = True
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    text = seen.decode("utf-8", "replace")
    assert asked, text
    assert os.waitstatus_to_exitcode(status) == 130, text
    assert "interrupted" in text and "Traceback" not in text
    assert "Abort" not in text  # the tool's message only (typer's "Aborted." was printed too)
