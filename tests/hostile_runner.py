"""Run the CLI in a child process that cannot hang CI or eat the machine's memory.

The child sets an address-space limit (RLIMIT_AS) before it imports anything of the tool,
then runs ``ddtree_deploy.cli.app.main(argv)``; the parent gives it a short timeout. A case
that regresses into an alias bomb ends in MemoryError (a traceback, a failed test), one that
regresses into a hang ends at the timeout: neither stalls or sinks the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from foreground import sigint_default

ROOT = Path(__file__).resolve().parents[1]
GOOD_HOSTS = ROOT / "tests" / "data" / "hosts_good" / "minimal.yaml"
ADDRESS_SPACE = 1 << 30  # 1 GiB: the CLI needs about 40 MB resident
TIMEOUT_S = 60.0  # generous for a loaded machine; a hang would otherwise be forever

CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
{before}
from ddtree_deploy.cli.app import main
main(sys.argv[1:])
"""


@dataclass
class Ran:
    rc: int
    stdout: str
    stderr: str

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr


def run_cli(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None,
            stdout: IO[bytes] | None = None, before: str = "") -> Ran:
    """``ddtree-deploy ARGV`` in a bounded child; stdout captured unless a file is given."""
    code = CHILD.format(limit=ADDRESS_SPACE, before=before)
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "80",
                "XDG_STATE_HOME": str(cwd / "state"), "XDG_CONFIG_HOME": str(cwd / "config"),
                "DDTREE_DEPLOY_HOSTS": "", **(env or {})}
    # as from a terminal: SIGINT at its default even where the suite runs as a background job
    # (which inherits it ignored; the CLI keeps an ignored SIGINT ignored)
    proc = subprocess.run(sigint_default([sys.executable, "-c", code, *argv]), cwd=cwd,
                          env=full_env,
                          stdin=subprocess.DEVNULL,
                          stdout=stdout if stdout is not None else subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=TIMEOUT_S, check=False)
    out = proc.stdout.decode("utf-8", "replace") if proc.stdout is not None else ""
    return Ran(proc.returncode, out, proc.stderr.decode("utf-8", "replace"))
