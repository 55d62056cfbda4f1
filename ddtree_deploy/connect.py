"""From a host of the hosts file to an open transport (SSH, or local for localhost)."""

from __future__ import annotations

from ddtree_deploy.config import Config, HostSpec
from ddtree_deploy.transport.base import ExecTransport


def open_transport(config: Config, host: HostSpec | str) -> ExecTransport:
    """A transport to `host` (connected lazily, on first use). Jump hosts chain."""
    from ddtree_deploy.transport.local import LocalTransport
    from ddtree_deploy.transport.ssh import SshTransport

    spec = config.host(host) if isinstance(host, str) else host
    if spec.is_local:
        return LocalTransport(host=spec.name)
    jump = open_transport(config, spec.jump) if spec.jump else None
    if jump is not None and not isinstance(jump, SshTransport):
        jump = None  # a local "jump" is no hop at all
    return SshTransport(
        spec.target,
        known_hosts=spec.known_hosts,
        port=spec.port if spec.address else None,
        user=spec.user if spec.address else None,
        identity_file=spec.identity_file,
        connect_timeout=spec.connect_timeout,
        jump=jump,
        load_ssh_config=spec.ssh_alias is not None,
        name=spec.name,
    )
