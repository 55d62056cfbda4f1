"""The CLI in a hostile environment: closed standard streams, an ASCII-only encoding.

Every case is data: how the command is started, the exit code expected and a fragment of
its one message; never a traceback. Run as subprocesses (the streams are the process's own).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "data" / "bench" / "standin-sweep.json"
HOSTS = """\
version: 1
hosts:
  gpu1:
    address: 10.0.0.5
    venvs:
      serve: {path: /opt/v\u00e9, role: serving}
deployments:
  svc:
    host: gpu1
    venv: serve
    cuda_lane: cu130
    sglang: {version: 0.5.11}
    algorithm: dflash
    model_path: /m/t\u00e9
    draft_model_path: /m/d
    port: 30001
"""


def _close(*fds: int) -> Callable[[], None]:
    def close() -> None:
        for fd in fds:
            os.close(fd)
    return close


# (case id, args after --hosts FILE, environment additions, streams closed in the child,
#  exit code, fragment of stderr (or None), fragment of stdout (or None))
CASES: list[tuple[str, list[str], dict[str, str], tuple[int, ...], int, str | None,
                  str | None]] = [
    ("stdout-closed", ["hosts", "list"], {}, (1,), 1, "standard output is closed", None),
    ("stdout-closed-json", ["hosts", "list", "--json"], {}, (1,), 1, "standard output is closed",
     None),
    ("stdin-closed-hosts-list", ["hosts", "list"], {}, (0,), 0, None, "svc"),
    ("stderr-closed-bad-hosts", ["--hosts", "/nonexistent/\u00e9.yaml", "hosts", "list"], {},
     (2,), 2, None, None),
    ("ascii-encoding-non-ascii-path", ["hosts", "list"], {"PYTHONIOENCODING": "ascii"}, (), 0,
     None, "/opt/v\\xe9"),
    ("ascii-encoding-error-path", ["--hosts", "/nonexistent/\u00e9/h.yaml", "hosts", "list"],
     {"PYTHONIOENCODING": "ascii"}, (), 2, "/nonexistent/\\xe9/h.yaml", None),
    ("ascii-json", ["bench", "recommend", "--results", "{dir}/results.json", "--json"],
     {"PYTHONIOENCODING": "ascii"}, (), 0, None, "h\\u00e9"),
    ("ascii-report",
     ["bench", "report", "--results", "{dir}/results.json", "--out", "{dir}/r\u00e9"],
     {"PYTHONIOENCODING": "ascii"}, (), 0, "r\\xe9", None),
    ("results-empty-name", ["bench", "report", "--results", ""], {}, (), 2,
     "--results '': expected a file name", None),
    ("grid-blank-name", ["bench", "gpu1", "--grid", " ", "--dry-run"], {}, (), 2,
     "--grid ' ': expected a file name", None),
    ("out-empty-name", ["bench", "report", "--results", "{dir}/results.json", "--out", ""], {},
     (), 2, "--out '': expected a folder name", None),
    ("recommend-write-stdin-closed",
     ["bench", "recommend", "--results", str(RECORDED), "--write", "svc"], {}, (0,), 2,
     "confirm on a terminal, or pass --yes", None),
]


@pytest.mark.parametrize(("case", "args", "env", "closed", "code", "err", "out"), CASES,
                         ids=[c[0] for c in CASES])
def test_the_cli_in_a_hostile_environment(tmp_path: Path, case: str, args: list[str],
                                          env: dict[str, str], closed: tuple[int, ...],
                                          code: int, err: str | None, out: str | None) -> None:
    hosts = tmp_path / "h\u00e9" / "hosts.yaml"
    hosts.parent.mkdir()
    hosts.write_text(HOSTS, encoding="utf-8")
    (hosts.parent / "results.json").write_bytes(RECORDED.read_bytes())
    before = hosts.read_bytes()
    args = [a.replace("{dir}", str(hosts.parent)) for a in args]
    argv = args if args[0] == "--hosts" else ["--hosts", str(hosts), *args]
    stderr_file = tmp_path / "stderr"
    with stderr_file.open("wb") as errf:
        done = subprocess.run(
            [sys.executable, "-m", "ddtree_deploy.cli", *argv], stdout=subprocess.PIPE,
            stderr=errf, env={**os.environ, "NO_COLOR": "1", **env}, cwd=tmp_path,
            preexec_fn=_close(*closed), timeout=120, check=False)
    stderr = stderr_file.read_bytes().decode("utf-8", "replace")
    stdout = done.stdout.decode("utf-8", "replace")
    assert done.returncode == code, (stdout, stderr)
    assert "Traceback" not in stderr
    if err is not None:
        assert err in stderr
    if out is not None:
        assert out in stdout
    assert hosts.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h\u00e9", "stderr"]


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(HOSTS, encoding="utf-8")
    reader, writer = os.pipe()
    os.close(reader)  # `| head -c0`: the reader is gone before the first line
    try:
        done = subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts),
                               "bench", "recommend", "--results", str(RECORDED), "--json"],
                              stdout=writer, stderr=subprocess.PIPE, timeout=120, check=False)
    finally:
        os.close(writer)
    assert done.returncode == 1
    assert b"Traceback" not in done.stderr and b"Broken pipe" not in done.stderr


def test_sigterm_at_any_moment_of_recommend_write_leaves_old_or_new_and_no_temporary(
        tmp_path: Path) -> None:
    """SIGTERM sent while `recommend --write --yes` runs, at moments spread over its run: the
    hosts file is whole (the old text or the new), and no temporary is ever left."""
    import signal
    import time

    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(HOSTS, encoding="utf-8")
    old = hosts.read_bytes()
    argv = [sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts), "bench",
            "recommend", "--results", str(RECORDED), "--write", "svc", "--yes"]
    seen = set()
    for step in range(12):
        hosts.write_bytes(old)
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.1 * step)  # moments spread over the run; any outcome below is allowed
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert b"Traceback" not in err
        text = hosts.read_bytes()
        seen.add("old" if text == old else "new")
        if text != old:
            assert b"algorithm: ddtree" in text
        assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.yaml"]
    assert "old" in seen


@pytest.mark.parametrize(("value", "fragment"), [
    ("/m/t\\x9b31m", "U+009B"), ("/m/t\\N", "U+0085"), ("/m/t\\LExecStart=/bin/x", "U+2028"),
    ("/m/t\\e[2J", "U+001B"),
])
def test_service_render_refuses_what_a_unit_cannot_carry_and_prints_no_control(
        tmp_path: Path, value: str, fragment: str) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(HOSTS.replace("model_path: /m/t\u00e9", f'model_path: "{value}"'),
                     encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(hosts),
                           "service", "render", "gpu1", "svc", "--no-verify"],
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 2
    err = done.stderr.decode("utf-8", "replace")
    assert "deployments.svc.model_path" in err and fragment in err
    assert not any(ch in err for ch in "\x9b\x85\u2028\x1b")
    assert done.stdout == b""
