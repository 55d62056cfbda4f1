"""A rendered unit run as a plain process (hosts without systemd): parse back, start, stop."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddtree_deploy.errors import ExitCode
from ddtree_deploy.localproc import pid_alive
from ddtree_deploy.service.plainproc import (
    PlainCommand,
    PlainProcError,
    group_alive,
    start,
    stop,
)
from ddtree_deploy.service.render import WrapperSpec, render_unit, render_wrapper
from ddtree_deploy.service.spec import ServiceSpec

ODD = ['50% "quoted" $HOME ${X}', "back\\slash", "semi;colon", "it's", "tab-free words"]


def test_sglang_unit_round_trips_to_its_argv_env_and_cwd() -> None:
    spec = ServiceSpec(
        name="sglang-ddtree", host="localhost", venv="/opt/my venv%1", gpus=(1,), port=30001,
        model_path="/models/Qwen 3 $8B", draft_model_path="/models/draft%x",
        algorithm="ddtree", ddtree_budget=15, ddtree_topk=8, num_draft_tokens=16,
        attention_backend="triton", extra_args=("--skip-tokenizer-init", *ODD),
        ld_library_path=("/opt/lib a", "/opt/lib$b"),
    )
    cmd = PlainCommand.from_unit(render_unit(spec, tool_version="0.0-test"))
    assert cmd.argv == (spec.python, "-m", "sglang.launch_server", *spec.server_args())
    assert cmd.cwd == "/opt/my venv%1"
    assert cmd.env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1",
        "LD_LIBRARY_PATH": "/opt/lib a:/opt/lib$b", "PYTHONUNBUFFERED": "1",
    }


def test_wrapper_unit_round_trips() -> None:
    unit = render_wrapper(
        WrapperSpec(name="w", command=("/usr/bin/env", *ODD), gpus=(0, 3), workdir="/tmp",
                    env={"MY_VAR": 'a "b" 100%'}),
        "0.0-test",
    )
    cmd = PlainCommand.from_unit(unit)
    assert cmd.argv == ("/usr/bin/env", *ODD)
    assert cmd.env["MY_VAR"] == 'a "b" 100%'
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "0,3"
    assert cmd.cwd == "/tmp"


@pytest.mark.parametrize(
    ("unit", "message"),
    [
        ("[Service]\nType=simple\n", "no ExecStart"),
        ("[Service]\nExecStart=/bin/echo %n\n", "specifier %n"),
        ("[Service]\nExecStart=/bin/echo $HOME\n", "environment reference"),
        ("[Service]\nExecStart=-/bin/echo x\n", "prefix '-'"),
        ("[Service]\nExecStart=bin/echo x\n", "absolute path"),
        ('[Service]\nExecStart=/bin/echo "open\n', "unterminated"),
        ("[Service]\nExecStart=/bin/echo a \\\n", "ends with a backslash"),
        ("[Service]\nEnvironment=NOEQUALS\nExecStart=/bin/true\n", "is not NAME=value"),
        ("[Service]\nExecStart=/bin/a\nExecStart=/bin/b\n", "more than one ExecStart"),
    ],
)
def test_units_the_renderer_never_writes_are_refused(unit: str, message: str) -> None:
    with pytest.raises(PlainProcError) as info:
        PlainCommand.from_unit(unit)
    assert message in info.value.message
    assert info.value.exit_code == ExitCode.USAGE


def test_execstart_outside_service_section_is_ignored() -> None:
    unit = "[Unit]\nExecStart=/bin/false\n[Service]\nExecStart=/bin/true  'a b'\n"
    assert PlainCommand.from_unit(unit).argv == ("/bin/true", "a b")


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
    unit = render_wrapper(
        WrapperSpec(name="plain", command=(sys.executable, str(script), mode, "x y"), gpus=(2,),
                    workdir=str(tmp_path)),
        "0.0-test",
    )
    log = tmp_path / "server.log"
    log.write_text("earlier run\n")
    pid = start(PlainCommand.from_unit(unit), str(log))
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
    cmd = PlainCommand(argv=(str(tmp_path / "nope"),), cwd=str(tmp_path))
    with pytest.raises(PlainProcError, match="cannot start .*nope"):
        start(cmd, str(tmp_path / "log"))
    with pytest.raises(PlainProcError, match="log folder"):
        start(cmd, str(tmp_path / "missing" / "log"))
