"""The wire side of host keys (paramiko): a TCP connection, the key a server offers, trust.

paramiko's transport thread logs a failed handshake with its traceback; with no logging set
up, Python prints that on stderr. Its log goes to WIRE_LOG instead, under the tool's own
logger, which has a NullHandler (the standard library's advice for a library): the error
itself reaches the user once, mapped, as every other.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import paramiko

from ddtree_deploy.errors import TransportError, UnreachableError
from ddtree_deploy.transport.hostkeys import (
    KnownHosts,
    changed_key_error,
    fingerprint,
    host_key_algorithms,
    host_key_name,
    no_common_type_error,
    revoked_key_error,
)

WIRE_LOG = "ddtree_deploy.transport.wire"
logging.getLogger(WIRE_LOG).addHandler(logging.NullHandler())


def connect_socket(label: str, address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection, or UnreachableError within `timeout` seconds."""
    where = f"{label} ({address}:{port})"
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
        # SSH messages are small and answered: without TCP_NODELAY, Nagle's algorithm and
        # the peer's delayed ACK hold each command's last packet for about 40 ms.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    except TimeoutError as exc:
        raise UnreachableError(f"{where} unreachable: no answer within {timeout:g}s") from exc
    except socket.gaierror as exc:
        raise UnreachableError(f"{where} unreachable: cannot resolve {address}: {exc}") from exc
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UnreachableError(
            f"{where} unreachable: {reason.lower()} (connect timeout {timeout:g}s)"
        ) from exc


def new_transport(sock: object, algorithms: list[str], **kwargs: object) -> paramiko.Transport:
    """A paramiko Transport that offers `algorithms` (in that order) for the host key and logs
    to WIRE_LOG; also SSHClient's transport_factory."""
    transport = paramiko.Transport(sock, **kwargs)  # type: ignore[arg-type]
    transport.set_log_channel(WIRE_LOG)
    options = transport.get_security_options()
    supported = [a for a in algorithms if a in options.key_types]
    if supported:
        options.key_types = supported
    return transport


def handshake_error(where: str, exc: BaseException, remote_version: str | None,
                    timeout: float) -> UnreachableError | None:
    """The error for a server that did not speak SSH (no banner), else None."""
    if remote_version and "banner" not in str(exc).lower():
        return None
    context = exc.__context__ or exc.__cause__
    if isinstance(context, (EOFError, ConnectionError)) or isinstance(exc, EOFError):
        return UnreachableError(f"{where} unreachable: the server closed the connection without "
                                "an SSH banner (is an SSH server on that port?)")
    return UnreachableError(f"{where} unreachable: no SSH banner within {timeout:g}s")


def scan_key(
    label: str,
    address: str,
    port: int,
    *,
    timeout: float,
    algorithms: list[str] | None = None,
) -> paramiko.PKey:
    """Read the host key the server presents, without authenticating."""
    where = f"{label} ({address}:{port})"
    sock = connect_socket(label, address, port, timeout)
    transport = new_transport(sock, algorithms or [])
    transport.banner_timeout = timeout
    try:
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    except paramiko.SSHException as exc:
        mapped = handshake_error(where, exc, transport.remote_version, timeout)
        if mapped is not None:
            raise mapped from exc
        raise TransportError(f"{where}: SSH handshake failed: {exc}") from exc
    except (OSError, EOFError) as exc:
        raise UnreachableError(f"{where} unreachable: connection closed during handshake") \
            from exc
    finally:
        transport.close()
        sock.close()


@dataclass(frozen=True)
class TrustResult:
    status: Literal["added", "already-known", "declined"]
    name: str
    keytype: str
    fingerprint: str
    known_hosts: Path


def trust_host(
    address: str,
    port: int,
    known_hosts: Path,
    *,
    confirm: Callable[[str], bool],
    timeout: float,
    label: str | None = None,
) -> TrustResult:
    """Fetch a host's key, show it, and record it after confirmation.

    A key already recorded is reported as such; a different key than the one recorded is
    refused with both fingerprints (HostKeyChangedError), a revoked one as revoked.
    """
    label = label or address
    known = KnownHosts(known_hosts)
    recorded = known.lookup(address, port)
    name = host_key_name(address, port)
    try:
        key = scan_key(label, address, port, timeout=timeout,
                       algorithms=host_key_algorithms(recorded))
    except TransportError as exc:
        if recorded and "host key" in str(exc).lower():
            raise no_common_type_error(label, name, recorded, known.path) from exc
        raise
    blob = key.asbytes()
    fp = fingerprint(blob)
    revoked = known.revoked(blob)
    if revoked is not None:
        raise revoked_key_error(label, name, blob, known.path, revoked.line)
    if any(k.blob == blob for k in recorded):
        return TrustResult("already-known", name, key.get_name(), fp, known.path)
    if recorded:
        raise changed_key_error(label, name, blob, recorded, known.path)
    question = f"{name} offers a {key.get_name()} key {fp}. Record it in {known.path}?"
    if not confirm(question):
        return TrustResult("declined", name, key.get_name(), fp, known.path)
    known.append(address, port, key.get_name(), blob)
    return TrustResult("added", name, key.get_name(), fp, known.path)
