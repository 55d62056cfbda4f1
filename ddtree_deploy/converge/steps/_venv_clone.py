"""`venv clone HOST SRC DST`: the copy of a venv the story made by hand, done right.

The copy keeps symlinks (bin/python stays a link to the base interpreter), then
every text script in DST/bin whose first line names SRC's interpreter is pointed
at DST's, pyvenv.cfg's `command` line is updated, and the clone's python is run
once to prove it starts and sees its own prefix. DST must not exist. One round
trip: a stdlib script run by the host's python3 (remote/venv_clone.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddtree_deploy.errors import RefusedError, RemoteCommandError
from ddtree_deploy.remote.bundle import text
from ddtree_deploy.remote.runner import run_json
from ddtree_deploy.transport.base import ExecTransport


@dataclass(frozen=True)
class Cloned:
    src: str
    dst: str
    fixed_scripts: list[str]


def clone(t: ExecTransport, src: str, dst: str) -> Cloned:
    data = run_json(t, text("venv_clone.py"), (src, dst), sudo=True, timeout=1800,
                    what="venv clone", answers=(0, 3))  # 3: refused, with its reason
    if "error" in data:
        raise RefusedError(f"{t.host}: {data['error']}")
    if data["rc"] != 0 or data["prefix"].rstrip("/") != dst.rstrip("/"):
        raise RemoteCommandError(f"{t.host}: the clone's python does not start as {dst}: "
                                 f"{data['stderr'] or data['prefix']}")
    return Cloned(src, dst, data["fixed"])
