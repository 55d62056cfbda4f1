"""A unit's command run as a plain process (hosts without systemd): start, stop."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddtree_deploy.localproc import pid_alive
from ddtree_deploy.service.plainproc import PlainProcError, group_alive, start, stop
from ddtree_deploy.service.render import WrapperSpec, unit_command, wrapper_command
from ddtree_deploy.service.spec import ServiceSpec, UnitCommand, unit_base_environment
from ddtree_deploy.settings.model import ServerSettings


def test_plain_mode_runs_the_model_the_unit_is_written_from() -> None:
    """The same object both ways: no text is parsed back (tests/test_hostile_units.py holds
    the unit's reading by systemd's rules to it)."""
    settings = ServerSettings.model_validate({"model_path": "/models/Qwen 3 $8B",
                                              "extra_args": ["--skip-tokenizer-init"]})
    spec = ServiceSpec(name="s", host="localhost", venv="/opt/my venv%1", gpus=(1,), port=1,
                       settings=settings)
    cmd = unit_command(spec)
    assert cmd.argv == (spec.python, "-m", "sglang.launch_server", *spec.server_args())
    assert cmd.cwd == "/opt/my venv%1"
    assert cmd.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1",
                       "PYTHONUNBUFFERED": "1"}
    assert cmd.environment({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "7"})["CUDA_VISIBLE_DEVICES"] \
        == "1"


SERVER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = os.fork()
    if child == 0:  # a child like SGLang's scheduler, in the same process group
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
                      "child": child, "pgid": os.getpgid(0), "sid": os.getsid(0),
                      "env": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "stdin": sys.stdin.read()}), flush=True)
    while True:
        time.sleep(1)
    """
)


def _started(tmp_path: Path, mode: str) -> tuple[int, dict[str, object], Path]:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    cmd = wrapper_command(
        WrapperSpec(name="plain", command=(sys.executable, str(script), mode, "x y"), gpus=(2,),
                    workdir=str(tmp_path)),
    )
    log = tmp_path / "server.log"
    log.write_text("earlier run\n")
    pid = start(cmd, str(log))
    for _ in range(400):
        lines = log.read_text().splitlines()
        if len(lines) > 1:
            return pid, json.loads(lines[1]), log
        time.sleep(0.05)
    stop(pid, timeout=1)
    raise AssertionError(f"the server wrote nothing: {log.read_text()!r}")


def test_start_detaches_into_its_own_group_and_stop_ends_the_group(tmp_path: Path) -> None:
    pid, seen, log = _started(tmp_path, "polite")
    try:
        assert seen["pid"] == pid == seen["pgid"] == seen["sid"]
        assert seen["argv"] == ["polite", "x y"]
        assert seen["cwd"] == str(tmp_path)
        assert seen["env"] == "2"
        assert seen["stdin"] == ""
        assert log.read_text().startswith("earlier run\n")  # appended, not truncated
        assert os.getpgid(pid) != os.getpgid(0)
        child = int(str(seen["child"]))
        assert pid_alive(child)
        # The main process obeys SIGTERM; its child ignores it and is killed with the group.
        assert stop(pid, timeout=10) is True
        assert not pid_alive(pid)
        assert not pid_alive(child)
        assert not group_alive(pid)
    finally:
        if group_alive(pid):
            os.killpg(pid, 9)


def test_stop_kills_a_main_process_that_ignores_sigterm(tmp_path: Path) -> None:
    pid, _, _ = _started(tmp_path, "stubborn")
    try:
        assert stop(pid, timeout=0.3) is False
        assert not pid_alive(pid)
        assert not group_alive(pid)
        assert stop(pid) is True  # already gone: nothing to do
    finally:
        if group_alive(pid):
            os.killpg(pid, 9)


def test_stop_refuses_a_pid_that_leads_no_group() -> None:
    with pytest.raises(PlainProcError, match="does not lead its own process group"):
        stop(os.getpid())
    with pytest.raises(PlainProcError, match="refusing"):
        stop(1)


def test_start_reports_a_missing_executable(tmp_path: Path) -> None:
    cmd = UnitCommand(argv=(str(tmp_path / "nope"),), cwd=str(tmp_path))
    with pytest.raises(PlainProcError, match="cannot start .*nope"):
        start(cmd, str(tmp_path / "log"))
    with pytest.raises(PlainProcError, match="log folder"):
        start(cmd, str(tmp_path / "missing" / "log"))


def test_a_link_planted_where_the_log_goes_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("keep\n")
    log = tmp_path / "server.log"
    log.symlink_to(outside)
    cmd = UnitCommand(argv=("/bin/true",), cwd=str(tmp_path))
    with pytest.raises(PlainProcError, match="log file: .*server.log"):
        start(cmd, str(log))
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(PlainProcError, match="log file: .*fifo.log"):  # never blocks on it
        start(cmd, str(fifo))
    assert outside.read_text() == "keep\n"


def test_a_plain_process_gets_the_units_environment_not_the_callers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exactly what systemd would give the unit's process (its PATH, the user's HOME, USER,
    LOGNAME, SHELL, the system's LANG), the unit's own variables and its EnvironmentFile's:
    nothing else of the caller's environment reaches the server."""
    monkeypatch.setenv("CALLER_ONLY_SECRET", "leaked")
    monkeypatch.setenv("PYTHONPATH", "/caller/path")
    monkeypatch.setenv("LD_PRELOAD", "/caller/lib.so")
    env_file = tmp_path / "environment"
    env_file.write_text("HF_TOKEN=hf_fromTheFile\n")
    script = tmp_path / "server.py"
    script.write_text("import json, os\nprint(json.dumps(dict(os.environ)), flush=True)\n")
    cmd = UnitCommand(argv=(sys.executable, "-S", str(script)),
                      env={"CUDA_VISIBLE_DEVICES": "3", "PYTHONUNBUFFERED": "1"},
                      cwd=str(tmp_path), env_file=str(env_file))
    log = tmp_path / "server.log"
    start(cmd, str(log))
    for _ in range(400):
        if log.read_text().strip():
            break
        time.sleep(0.05)
    seen = json.loads(log.read_text().splitlines()[0])
    seen.pop("LC_CTYPE", None)  # Python's own locale coercion (PEP 538) in the child
    base = unit_base_environment()
    assert seen == {**base, "CUDA_VISIBLE_DEVICES": "3", "PYTHONUNBUFFERED": "1",
                    "HF_TOKEN": "hf_fromTheFile"}
    assert base["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert set(base) - {"LANG"} == {"PATH", "HOME", "USER", "LOGNAME", "SHELL"}
    assert base["HOME"] == os.environ["HOME"]
    # an explicit base (the rehearsal's) is still taken as given
    assert cmd.environment({"X": "1"})["X"] == "1"
