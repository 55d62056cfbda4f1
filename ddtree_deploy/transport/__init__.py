"""The narrow channel to hosts: commands, results, local and SSH transports.

The SSH parts (paramiko, fabric) load only when first used, so commands that
talk to no host (plan on cached facts, doctor, config checks) start quickly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ddtree_deploy.transport.base import ExecTransport, Result, Transport
from ddtree_deploy.transport.command import Command

if TYPE_CHECKING:
    from ddtree_deploy.transport.hostkeys import KnownHosts, fingerprint, host_key_name
    from ddtree_deploy.transport.hostscan import TrustResult, trust_host
    from ddtree_deploy.transport.local import LocalTransport
    from ddtree_deploy.transport.ssh import SshTransport, sftp_upload

_LAZY = {
    "KnownHosts": "hostkeys",
    "TrustResult": "hostscan",
    "fingerprint": "hostkeys",
    "host_key_name": "hostkeys",
    "trust_host": "hostscan",
    "LocalTransport": "local",
    "SshTransport": "ssh",
    "sftp_upload": "ssh",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"ddtree_deploy.transport.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'ddtree_deploy.transport' has no attribute {name!r}")


__all__ = [
    "Command",
    "ExecTransport",
    "KnownHosts",
    "LocalTransport",
    "Result",
    "SshTransport",
    "Transport",
    "TrustResult",
    "fingerprint",
    "host_key_name",
    "sftp_upload",
    "trust_host",
]
