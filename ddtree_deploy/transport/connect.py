"""From a host of the hosts file to an open transport (SSH, or local for localhost)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddtree_deploy.config.hosts import Config, HostSpec
from ddtree_deploy.transport.base import ExecTransport

if TYPE_CHECKING:
    from ddtree_deploy.transport.openssh import OpenSshTransport


def open_transport(config: Config, host: HostSpec | str, *, reuse: bool = False) -> ExecTransport:
    """A transport to `host` (connected lazily, on first use). Jump hosts chain.

    reuse: for the facts probe and the overlay's bulk streams: an OpenSSH master connection kept
    open between runs (the host's ssh_persist seconds), where the host allows it: ssh_persist
    above 0, no jump host, the OpenSSH client installed and a private folder for its control
    socket. Otherwise, and for everything else, one paramiko connection of its own.
    """
    spec = config.host(host) if isinstance(host, str) else host
    if spec.is_local:
        from ddtree_deploy.transport.local import LocalTransport

        return LocalTransport(host=spec.name)
    if reuse and spec.ssh_persist > 0 and spec.jump is None:
        from ddtree_deploy.errors import TransportError
        from ddtree_deploy.transport import openssh

        if openssh.available():
            try:
                return openssh_transport(spec)
            except TransportError:
                pass  # no usable folder for its control socket: a connection of its own
    from ddtree_deploy.transport.ssh import SshTransport

    jump = open_transport(config, spec.jump) if spec.jump else None
    if jump is not None and not isinstance(jump, SshTransport):
        jump = None  # a local "jump" is no hop at all
    return SshTransport(spec.target, jump=jump, **_ssh_options(spec))


def _ssh_options(spec: HostSpec) -> dict[str, Any]:
    """What both SSH transports take from a host entry (port and user only with an address:
    an ~/.ssh/config alias brings its own)."""
    return {
        "known_hosts": spec.known_hosts,
        "port": spec.port if spec.address else None,
        "user": spec.user if spec.address else None,
        "identity_file": spec.identity_file,
        "connect_timeout": spec.connect_timeout,
        "load_ssh_config": spec.ssh_alias is not None,
        "name": spec.name,
    }


def openssh_transport(spec: HostSpec) -> OpenSshTransport:
    """The host's OpenSSH transport (its master connection kept ssh_persist seconds)."""
    from ddtree_deploy.transport.openssh import OpenSshTransport

    return OpenSshTransport(spec.target, persist=spec.ssh_persist, **_ssh_options(spec))
