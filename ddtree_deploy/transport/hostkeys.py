"""known_hosts handling: our own parser, OpenSSH fingerprints, strict checks, trust.

paramiko's HostKeys raises on `@cert-authority` lines, so the file is parsed
here: plain and hashed (`|1|salt|hash`) host fields, `*`/`?` patterns and `!`
negations, `@revoked` keys (refused) and `@cert-authority` lines (kept, unused).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import paramiko

from ddtree_deploy.errors import HostKeyError, TransportError, UnreachableError


def host_key_name(address: str, port: int) -> str:
    """The name OpenSSH files a host's key under: `addr` on port 22, else `[addr]:port`."""
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(blob: bytes) -> str:
    """OpenSSH-style `SHA256:base64-without-padding` of a public key blob."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii")
    return "SHA256:" + digest.rstrip("=")


def key_type_of(blob: bytes) -> str:
    """The type name stored at the head of an SSH public key blob."""
    if len(blob) < 4:
        return "unknown"
    size = int.from_bytes(blob[:4], "big")
    return blob[4 : 4 + size].decode("ascii", errors="replace")


@dataclass(frozen=True)
class KnownKey:
    keytype: str
    blob: bytes
    line: int
    marker: str | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)


@dataclass(frozen=True)
class _Entry:
    hosts: tuple[str, ...]
    key: KnownKey


def _glob(pattern: str) -> re.Pattern[str]:
    """OpenSSH host patterns know only `*` and `?`; brackets are literal (`[addr]:port`)."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body + r"\Z", re.DOTALL)


def _match_field(field: str, name: str) -> bool:
    """Whether a known_hosts host field (comma list, hashes, patterns) names `name`."""
    name = name.lower()
    if field.startswith("|1|"):
        try:
            _, _, salt_b64, hash_b64 = field.split("|", 3)
            salt = base64.b64decode(salt_b64)
            want = base64.b64decode(hash_b64)
        except (ValueError, binascii.Error):
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)
    matched = False
    for pattern in field.lower().split(","):
        negated = pattern.startswith("!")
        if _glob(pattern[1:] if negated else pattern).match(name):
            if negated:
                return False
            matched = True
    return matched


class KnownHosts:
    """One known_hosts file, read once; `append` writes a new line to it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._entries: list[_Entry] = []
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            text = ""
        except OSError as exc:
            raise TransportError(f"cannot read known_hosts file {self.path}: {exc}") from exc
        for number, raw in enumerate(text.splitlines(), start=1):
            entry = self._parse(raw, number)
            if entry is not None:
                self._entries.append(entry)

    @staticmethod
    def _parse(raw: str, number: int) -> _Entry | None:
        parts = raw.split()
        if not parts or parts[0].startswith("#"):
            return None
        marker = None
        if parts[0].startswith("@"):
            marker, parts = parts[0], parts[1:]
        if len(parts) < 3:
            return None  # malformed lines are skipped, as OpenSSH does
        try:
            blob = base64.b64decode(parts[2], validate=True)
        except (ValueError, binascii.Error):
            return None
        return _Entry(tuple(parts[0:1]), KnownKey(parts[1], blob, number, marker))

    def lookup(self, address: str, port: int) -> list[KnownKey]:
        """The keys recorded for this address and port (no marker lines)."""
        name = host_key_name(address, port)
        return [
            e.key
            for e in self._entries
            if e.key.marker is None and any(_match_field(h, name) for h in e.hosts)
        ]

    def is_revoked(self, blob: bytes) -> bool:
        return any(e.key.marker == "@revoked" and e.key.blob == blob for e in self._entries)

    def append(self, address: str, port: int, keytype: str, blob: bytes) -> str:
        """Append `name keytype base64` to the file (created 0600 in a 0700 folder)."""
        line = f"{host_key_name(address, port)} {keytype} {base64.b64encode(blob).decode()}"
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            prefix = ""
            if self.path.exists():
                existing = self.path.read_bytes()
                if existing and not existing.endswith(b"\n"):
                    prefix = "\n"
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(prefix + line + "\n")
            self.path.chmod(0o600)
        except OSError as exc:
            raise TransportError(f"cannot write known_hosts file {self.path}: {exc}") from exc
        self._entries.append(_Entry((host_key_name(address, port),), KnownKey(keytype, blob, 0)))
        return line


def unknown_key_error(label: str, name: str, key: paramiko.PKey, path: Path) -> HostKeyError:
    return HostKeyError(
        f"{label}: the host key of {name} is not known ({key.get_name()} "
        f"{fingerprint(key.asbytes())}); refusing to connect",
        hint=f"check the key, then run `ddtree-deploy hosts trust {label}` "
        f"(known_hosts file: {path})",
    )


def changed_key_error(
    label: str, name: str, offered: bytes, known: list[KnownKey], path: Path
) -> HostKeyError:
    old = ", ".join(f"{k.keytype} {k.fingerprint} (line {k.line})" for k in known)
    return HostKeyError(
        f"{label}: HOST KEY CHANGED for {name}: known {old}; offered now "
        f"{key_type_of(offered)} {fingerprint(offered)}. Refusing to connect.",
        hint=f"if the change is expected (host reinstalled), remove the old line from {path}, "
        f"then run `ddtree-deploy hosts trust {label}`",
    )


def revoked_key_error(label: str, name: str, offered: bytes, path: Path) -> HostKeyError:
    return HostKeyError(
        f"{label}: the host key of {name} ({fingerprint(offered)}) is marked @revoked in {path}"
    )


def check_key(label: str, address: str, port: int, key: paramiko.PKey, known: KnownHosts) -> None:
    """Accept `key` only when known_hosts records exactly it for this host."""
    name = host_key_name(address, port)
    blob = key.asbytes()
    if known.is_revoked(blob):
        raise revoked_key_error(label, name, blob, known.path)
    recorded = known.lookup(address, port)
    if any(k.blob == blob for k in recorded):
        return
    if recorded:
        raise changed_key_error(label, name, blob, recorded, known.path)
    raise unknown_key_error(label, name, key, known.path)


def preferred_key_types(recorded: list[KnownKey]) -> list[str]:
    """Host key algorithms to offer so the server shows a key type we know."""
    types: list[str] = []
    for key in recorded:
        names = (
            ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]
            if key.keytype == "ssh-rsa"
            else [key.keytype]
        )
        types += [n for n in names if n not in types]
    return types


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


def scan_key(
    label: str,
    address: str,
    port: int,
    *,
    timeout: float,
    key_types: list[str] | None = None,
) -> paramiko.PKey:
    """Read the host key the server presents, without authenticating."""
    sock = connect_socket(label, address, port, timeout)
    transport = paramiko.Transport(sock)
    transport.banner_timeout = timeout
    if key_types:
        options = transport.get_security_options()
        supported = [t for t in key_types if t in options.key_types]
        if supported:
            options.key_types = supported
    try:
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    except paramiko.SSHException as exc:
        text = str(exc)
        if "banner" in text.lower() or not transport.remote_version:
            raise UnreachableError(
                f"{label} ({address}:{port}) unreachable: no SSH banner within {timeout:g}s"
            ) from exc
        raise TransportError(f"{label} ({address}:{port}): SSH handshake failed: {text}") from exc
    except (OSError, EOFError) as exc:
        raise UnreachableError(
            f"{label} ({address}:{port}) unreachable: connection closed during handshake"
        ) from exc
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

    A key already recorded is reported as such; a different key than the one
    recorded is refused with both fingerprints (HostKeyError).
    """
    label = label or address
    known = KnownHosts(known_hosts)
    recorded = known.lookup(address, port)
    key = scan_key(
        label, address, port, timeout=timeout, key_types=preferred_key_types(recorded) or None
    )
    name = host_key_name(address, port)
    blob = key.asbytes()
    fp = fingerprint(blob)
    if known.is_revoked(blob):
        raise revoked_key_error(label, name, blob, known.path)
    if any(k.blob == blob for k in recorded):
        return TrustResult("already-known", name, key.get_name(), fp, known.path)
    if recorded:
        raise changed_key_error(label, name, blob, recorded, known.path)
    question = f"{name} offers a {key.get_name()} key {fp}. Record it in {known.path}?"
    if not confirm(question):
        return TrustResult("declined", name, key.get_name(), fp, known.path)
    known.append(address, port, key.get_name(), blob)
    return TrustResult("added", name, key.get_name(), fp, known.path)
