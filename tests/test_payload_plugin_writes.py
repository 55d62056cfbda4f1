"""The payload rules for the plugin form (SGLang 0.5.17+) when its install fails or is killed,
as tests/test_payload_writes.py checks them for the patch set: no state written, the tool's own
temporaries (the staged wheel) swept, the venv's lock released, the venv as it was.

Each case is a row of CASES: a real venv with the real sglang 0.5.17 and pip, a copy of this
repository's payload whose plugin carries one large, well-compressed file, and the real CLI on
localhost in a subprocess, made to fail one way:
* failed: a write past RLIMIT_FSIZE fails in pip (EFBIG) half-way through the plugin's files;
* installer killed: pip SIGKILLed as it opens the plugin's worker.py for writing (an audit hook
  a `.pth` file of the venv installs);
* CLI killed: the same moment, the CLI itself SIGKILLed (and pip with it): the lock's holder is
  gone, the half install and the staged wheel stay until the next command on the venv.
Then a plain deploy: it undoes what is left, installs, and the venv ends as a clean deploy
leaves it.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import wheelcache

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300
FSIZE = 150_000  # above the wheel (~70 kB), below the padded worker.py (~270 kB)
# Kills at the moment pip opens the plugin's worker.py for writing: pip itself, or first the
# CLI that runs it (found up the parent chain) then pip.
HOOK = (
    "import os, sys\n"
    "def _cli():\n"
    "    pid = os.getppid()\n"
    "    while pid > 1:\n"
    "        with open(f'/proc/{pid}/cmdline', 'rb') as fh:\n"
    "            if b'ddtree_deploy.cli' in fh.read():\n"
    "                return pid\n"
    "        with open(f'/proc/{pid}/stat') as fh:\n"
    "            pid = int(fh.read().rsplit(')', 1)[1].split()[1])\n"
    "    return None\n"
    "def _hook(event, args):\n"
    "    if event == 'open' and str(args[0]).endswith('ddtree_sglang/worker.py') \\\n"
    "            and isinstance(args[1], str) and ('w' in args[1] or 'x' in args[1]):\n"
    "        if {kill_cli} and _cli():\n"
    "            os.kill(_cli(), 9)\n"
    "        os.kill(os.getpid(), 9)\n"
    "sys.addaudithook(_hook)\n"
)
CASES: list[dict[str, Any]] = [
    {"id": "failed", "fsize": FSIZE, "says": "pip install of the plugin failed"},
    {"id": "installer-killed", "hook": False, "says": "pip install of the plugin failed"},
    {"id": "cli-killed", "hook": True, "killed": True},
]


def _venv(root: Path, name: str) -> Path:
    venv = root / name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", "--no-compile", "--disable-pip-version-check",
                    str(wheelcache.wheel("sglang", "0.5.17"))], check=True)
    return venv


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


def _entries(folder: Path) -> dict[str, str]:
    """Every file (its sha256) and folder below `folder`, no __pycache__."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if "__pycache__" in p.parts:
            continue
        rel = str(p.relative_to(folder))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _limits(fsize: int | None) -> Callable[[], None]:
    def apply() -> None:
        os.setsid()  # the CLI's own session: a kill of it reaches nothing of the test's
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return apply


def cli(root: Path, payload: Path, *args: str, fsize: int | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "xdg/cache"), HOME=str(root / "home"),
               XDG_STATE_HOME=str(root / "xdg/state"), XDG_CONFIG_HOME=str(root / "xdg/config"),
               PATH="/usr/bin:/bin", NO_COLOR="1", COLUMNS="200")
    try:
        return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                               str(root / "hosts.yaml"), "payload", *args, "--payload",
                               str(payload), "--installer", "pip"],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
                              env=env, preexec_fn=_limits(fsize))
    except subprocess.TimeoutExpired:
        pytest.fail(f"payload {' '.join(args)} did not finish in {TIMEOUT_S} s")


@pytest.fixture()
def world(tmp_path: Path) -> tuple[Path, Path]:
    """hosts.yaml, a scratch HOME and XDG folders; the payload with a padded plugin file."""
    (tmp_path / "hosts.yaml").write_text("version: 1\nhosts: {}\n")
    (tmp_path / "home").mkdir()
    payload = tmp_path / "payload"
    shutil.copytree(ROOT / "payload", payload,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    worker = payload / "plugin/ddtree_sglang/worker.py"
    worker.write_text(worker.read_text() + "# padding\n" * 25000)
    return tmp_path, payload


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_a_failed_or_killed_plugin_install_leaves_the_venv_as_it_was(
        world: tuple[Path, Path], case: dict[str, Any]) -> None:
    root, payload = world
    venv, clean = _venv(root, "v"), _venv(root, "clean")
    said = cli(root, payload, "deploy", "localhost", "--venv", str(clean))
    assert said.returncode == 0, said.stdout + said.stderr
    before = _entries(_site(venv))
    hook = _site(venv) / "zz_kill_mid_install.pth"
    if "hook" in case:
        code = HOOK.replace("{kill_cli}", str(case["hook"]))
        hook.write_text(f"import sys; exec({code!r}, {{}})\n")  # its own globals
    r = cli(root, payload, "deploy", "localhost", "--venv", str(venv), fsize=case.get("fsize"))
    hook.unlink(missing_ok=True)
    out = r.stdout + r.stderr
    state = venv / ".ddtree-deploy"
    if case.get("killed"):
        assert r.returncode == -signal.SIGKILL, out
        assert (state / "pending.json").exists(), "the install's note stays for the next command"
    else:
        assert r.returncode == 1, out
        assert case["says"] in out and "Traceback" not in out, out
        assert _entries(_site(venv)) == before, "the half install stayed"
        assert not (state / "pending.json").exists()
        assert [p.name for p in state.iterdir()] == [], "a staged wheel or the state stayed"
    assert not (state / "payload.json").exists()
    # The lock was released with the command; the next deploy undoes what a kill left.
    again = cli(root, payload, "deploy", "localhost", "--venv", str(venv))
    out = again.stdout + again.stderr
    assert again.returncode == 0 and "Traceback" not in out, out
    if case.get("killed"):
        assert "an install of the plugin cut short was undone" in out, out
    got, want = _entries(_site(venv)), _entries(_site(clean))
    assert sorted(got) == sorted(want)  # RECORDs and direct_url.json name each venv's own path
    assert {k: v for k, v in got.items() if k.startswith(("ddtree/", "ddtree_sglang/"))} == \
        {k: v for k, v in want.items() if k.startswith(("ddtree/", "ddtree_sglang/"))}
    assert sorted(p.name for p in state.iterdir()) == ["payload.json"]
    assert json.loads((state / "payload.json").read_text())["form"] == "plugin"
