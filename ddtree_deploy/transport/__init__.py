"""The narrow channel to hosts: commands, results, local and SSH transports."""

from ddtree_deploy.transport.base import Command, ExecTransport, Result, Transport
from ddtree_deploy.transport.hostkeys import (
    KnownHosts,
    TrustResult,
    fingerprint,
    host_key_name,
    trust_host,
)
from ddtree_deploy.transport.local import LocalTransport
from ddtree_deploy.transport.ssh import SshTransport, sftp_upload

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
