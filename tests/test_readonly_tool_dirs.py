"""Read-only commands write nothing in the user's folders: HOME, every XDG folder, the
temporary folder, the working folder (the conventions' "a read writes nothing"; issue 30
item 2 checked the venvs, this the workstation).

Each command runs as a user would, in a child process whose HOME, XDG_CONFIG_HOME,
XDG_STATE_HOME, XDG_CACHE_HOME, XDG_RUNTIME_DIR and TMPDIR all lie in one folder, with the
working folder there too; the folder's whole tree (names, kinds, contents, modes) is compared
before and after. Commands that touch no host (help, version, `hosts list`, `hosts
disconnect`, `overlay --dry-run` up to its refusal, usage errors) change nothing at all;
those that read a host change only the documented caches (docs/usage.md, "Facts, their
cache"): the facts cache (`$XDG_STATE_HOME/ddtree-deploy/facts/`), the joined probe script
(`$XDG_CACHE_HOME/ddtree-deploy/probe-bundle/`) and, the host being this machine, the probe's
own cache in its user's `~/.cache/ddtree-deploy/`.
Found: `hosts disconnect` made the SSH control folder in XDG_RUNTIME_DIR, `overlay --dry-run`
the blob cache (and swept it), and a typo among apply's hosts wrote a run log (test_plan_fleet).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from payload_fakes import fake_venv

pytestmark = pytest.mark.integration

# what a read may leave, relative to the user's folder (docs/usage.md, "Facts, their cache")
CACHES = ("state/ddtree-deploy/facts/", "cache/ddtree-deploy/probe-bundle/",
          "home/.cache/ddtree-deploy/")


@pytest.fixture()
def user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a short path: the SSH control folder goes in XDG_RUNTIME_DIR only where a socket's
    # path fits (else in /tmp, out of sight)
    root = tmp_path_factory.mktemp("u")
    for name in ("home", "config", "state", "cache", "run", "tmp", "cwd", "venvs"):
        (root / name).mkdir(parents=True)
    (root / "run").chmod(0o700)
    serving = fake_venv(root / "venvs", "serving")
    (root / "hosts.yaml").write_text(
        "version: 1\nhosts:\n  ws:\n    transport: local\n    venvs:\n"
        f"      s: {{path: {serving}, role: serving}}\n"
        f"      t: {{path: {root / 'venvs' / 'training'}, role: training}}\n"
        "  far:\n    address: 127.0.0.1\n    port: 1\n    ssh_persist: 5\n")
    return root


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(root / "home"), "XDG_CONFIG_HOME": str(root / "config"),
           "XDG_STATE_HOME": str(root / "state"), "XDG_CACHE_HOME": str(root / "cache"),
           "XDG_RUNTIME_DIR": str(root / "run"), "TMPDIR": str(root / "tmp"), "NO_COLOR": "1",
           "DDTREE_DEPLOY_HOSTS": str(root / "hosts.yaml")}
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", *args],
                          capture_output=True, text=True, timeout=300, check=False, env=env,
                          cwd=root / "cwd", stdin=subprocess.DEVNULL)


def tree(root: Path) -> dict[str, tuple[str, int, bytes]]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            info = path.lstat()
            kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
            body = path.read_bytes() if stat.S_ISREG(info.st_mode) else b""
            out[path.relative_to(root).as_posix() + ("/" if kind == "dir" else "")] = (
                kind, stat.S_IMODE(info.st_mode), body)
    return out


def changed(root: Path, before: dict[str, tuple[str, int, bytes]]) -> list[str]:
    after = tree(root)
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


NOTHING = [
    ["--version"], ["-h"], ["hosts", "list"], ["hosts", "list", "--json"],
    ["hosts", "disconnect"], ["hosts", "disconnect", "far", "--json"],
    ["plan", "--bogus"], ["plan", "nosuch"], ["apply", "nosuch", "--yes"],
    # the source venv lacks the lane's packages: refused after the plan began
    ["overlay", "--abi", "cu130", "--from", "ws", "--from-venv", "VENVS/serving",
     "--to", "ws:VENVS/training", "--dry-run"],
]


@pytest.mark.parametrize("args", NOTHING, ids=[" ".join(a)[:50] for a in NOTHING])
def test_commands_that_touch_no_host_write_nothing(user: Path, args: list[str]) -> None:
    args = [a.replace("VENVS", str(user / "venvs")) for a in args]
    before = tree(user)
    ran = cli(user, *args)
    assert "Traceback" not in ran.stderr, ran.stderr
    assert changed(user, before) == [], (args, ran.returncode, ran.stderr)


READS = [["inventory", "ws"], ["doctor", "ws"], ["plan", "ws", "--json"],
         ["payload", "status", "ws"], ["overlay", "history", "ws"], ["hosts", "check", "ws"]]


@pytest.mark.parametrize("args", READS, ids=[" ".join(a) for a in READS])
def test_reads_write_only_the_documented_caches(user: Path, args: list[str]) -> None:
    before = tree(user)
    ran = cli(user, *args)
    assert "Traceback" not in ran.stderr, ran.stderr
    stray = [p for p in changed(user, before)
             if not any(p.startswith(c) or c.startswith(p) for c in CACHES)]
    assert stray == [], (args, ran.returncode, ran.stderr)
