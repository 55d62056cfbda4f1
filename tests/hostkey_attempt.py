"""One connection attempt over one SSH transport, as the host-key case table runs it.

Imported by tests/test_hostkeys_cases.py, or run as a script in a child process (cases that
could hang or print on stderr): `python tests/hostkey_attempt.py KIND KNOWN_HOSTS PORT KEY`
prints the outcome as one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def attempt(kind: str, known_hosts: Path, port: int, identity: Path) -> dict[str, Any]:
    """{"accepted": True} or {"error": class name, "classes": its bases' names, "message"}."""
    from ddtree_deploy.errors import DeployError
    from ddtree_deploy.transport.openssh import OpenSshTransport
    from ddtree_deploy.transport.ssh import SshTransport

    options: dict[str, Any] = {"known_hosts": known_hosts, "port": port, "user": "root",
                               "identity_file": identity, "connect_timeout": 5, "name": "box"}
    try:
        transport: OpenSshTransport | SshTransport
        if kind == "openssh":
            transport = OpenSshTransport("127.0.0.1", persist=5, **options)
        else:
            transport = SshTransport("127.0.0.1", load_ssh_config=False, **options)
        try:
            result = transport.run("echo in", timeout=20)
            return {"accepted": result.exit_code == 0 and result.stdout == "in\n"}
        finally:
            if isinstance(transport, OpenSshTransport):
                transport.disconnect()
            transport.close()
    except DeployError as exc:
        return {"error": type(exc).__name__, "message": str(exc),
                "classes": [c.__name__ for c in type(exc).__mro__]}


if __name__ == "__main__":
    kind, known, port, identity = sys.argv[1:5]
    print(json.dumps(attempt(kind, Path(known), int(port), Path(identity))))
