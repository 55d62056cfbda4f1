"""What systemd runs is what plain mode runs: hostile values through a real systemd (lab).

A wrapper unit whose program records its argv, working folder and environment is rendered
from a `UnitCommand` (`render.wrapper_command`), installed on ct129 and started by its real
systemd; what the process saw must be exactly the command plain mode would run. The values
are the accepted ones of tests/test_hostile_units.py's battery (quotes, `$`, `%`, `;`, `#`,
spaces at either end, NBSP, non-ASCII): the unit tests hold the renderer to systemd's
documented reading, this holds it to systemd itself.
"""

from __future__ import annotations

import io
import json
import time

import pytest

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.service.render import WrapperSpec, render_wrapper, wrapper_command
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.connect import open_transport

pytestmark = pytest.mark.lab
UNIT = "ddtree-quoting-probe"
OUT = "/run/ddtree-quoting-probe.json"
# one line: a unit cannot carry a newline in an argument (render refuses it)
RECORD = ("import json, os, sys, time; "
          "json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'env': dict(os.environ)},"
          " open(sys.argv[1], 'w')); time.sleep(600)")
ARGS = ["$HOME", "${X}", "$$", "%n", "%%", '"q"', "'a'", "back\\slash", "a\\x41", ";", "#h",
        " lead", "trail ", "\xa0nbsp\xa0", "\u00e9\u4e2d\U0001f600", "--api-keys-file", "a b  c"]
ENV = {"ODD_VALUE": 'a "b" 100% $x \\ ;', "NBSP_VALUE": "\xa0x\xa0"}
WORKDIR = "/tmp/odd dir %1/$x"


def test_systemd_runs_exactly_the_plain_command(lab: Config) -> None:
    spec = WrapperSpec(name=UNIT, command=("/usr/bin/python3", "-c", RECORD, OUT, *ARGS),
                       gpus=(0,), workdir=WORKDIR, env=ENV, host="ct129")
    command = wrapper_command(spec)
    unit = render_wrapper(spec, "0.0-test")
    with open_transport(lab, "ct129") as t:
        def sh(*argv: str) -> str:
            r = t.run(Command.of(*argv), timeout=60)
            assert r.ok, f"{argv}: {r.stderr}"
            return r.stdout

        sh("mkdir", "-p", WORKDIR)
        sh("rm", "-f", OUT)
        t.put_stream(io.BytesIO(unit.encode()), f"/etc/systemd/system/{UNIT}.service", mode=0o644)
        try:
            sh("systemctl", "daemon-reload")
            sh("systemctl", "start", f"{UNIT}.service")
            seen = None
            for _ in range(100):
                r = t.run(Command.of("cat", OUT), timeout=30)
                if r.ok and r.stdout.strip():
                    seen = json.loads(r.stdout)
                    break
                time.sleep(0.2)
            assert seen is not None, sh("systemctl", "status", "--no-pager", f"{UNIT}.service")
        finally:
            t.run(Command.of("systemctl", "stop", f"{UNIT}.service"), timeout=60)
            t.run(Command.of("rm", "-f", f"/etc/systemd/system/{UNIT}.service", OUT), timeout=30)
            t.run(Command.of("systemctl", "daemon-reload"), timeout=60)
    assert seen["argv"] == list(command.argv[3:])  # after python3 -c SCRIPT
    assert seen["cwd"] == command.cwd == WORKDIR
    for name, value in command.env.items():
        assert seen["env"].get(name) == value, name
