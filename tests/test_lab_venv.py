"""venv clone in the lab: the copy runs as itself, and the source is untouched."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

pytestmark = pytest.mark.lab


def test_clone_runs_as_itself(lab: Config) -> None:
    dst = "/root/venv-clone-test"

    def run(script: str, *args: str) -> str:
        with open_transport(lab, "ct200") as t:
            r = t.run(Command.shell(script, *args), timeout=120)
        assert r.ok, r.stderr
        return r.stdout

    before = run('cd /root/venv && find . -type f -print0 | sort -z | xargs -0 sha256sum')
    try:
        r = subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts", str(lab.path),
                            "venv", "clone", "ct200", "/root/venv", dst],
                           capture_output=True, text=True, timeout=300, check=False)
        assert r.returncode == 0, r.stderr
        assert run('head -n 1 "$1/bin/pip"', dst).strip().startswith(f"#!{dst}/bin/python")
        assert run('"$1/bin/pip" --version', dst).split()[3].startswith(dst)
        assert run('"$1/bin/python" -c "import sys, torch; print(sys.prefix, torch.__version__)"',
                   dst).split() == [dst, "2.11.0+cu128"]
        again = subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", "--hosts",
                                str(lab.path), "venv", "clone", "ct200", "/root/venv", dst],
                               capture_output=True, text=True, timeout=300, check=False)
        assert again.returncode == 1 and "already exists" in again.stderr
    finally:
        run('rm -rf "$1"', dst)
    assert run('cd /root/venv && find . -type f -print0 | sort -z | xargs -0 sha256sum') == before
