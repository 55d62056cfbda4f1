"""known_hosts: one reading for both SSH paths, the paramiko one and the OpenSSH client.

Both transports decide with `KnownHosts.check`. The paramiko transport calls it on the key
the server offers, before authenticating. The OpenSSH transport never lets ssh read the
user's file: it gives ssh a file of exactly the keys `check` accepts for this host
(`pinned_text`, under the fixed HostKeyAlias `PIN_ALIAS`), so patterns, ports, `%` tokens or
whitespace in the file's path cannot mean something else there. Both offer the same host key
algorithms in the same order (`host_key_algorithms`), so both see the same key.

The file is parsed here (paramiko's HostKeys raises on `@cert-authority`): plain and hashed
(`|1|salt|hash`) host fields, `*`/`?` patterns and `!` negations. What counts:
- a line naming `addr` (port 22) or `[addr]:port`, whose key type is the key's own;
- `@revoked`: that key is refused for every host, whatever the line's host field;
- `@cert-authority`: not honoured (paramiko cannot verify host certificates): a host known
  only through one is refused, with a message saying so;
- a port-less line for a host on another port counts for port 22 only: refused, and the
  message says how to record the key.
This module loads no paramiko: the facts path (OpenSSH) reads known_hosts too.

Which host and file `hosts trust HOST` means (`trust_target`): a host of the hosts file,
else an address (`addr`, `addr:port`, `[addr]:port`; `parse_address`) whose key goes to
~/.ssh/known_hosts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ddtree_deploy.errors import HostKeyError, UsageError

MAX_BYTES = 16 << 20  # a known_hosts file larger than this is refused, not read
PIN_ALIAS = "ddtree-deploy-pinned"  # the name ssh looks the host up under, in the pinned file
# The host key algorithms both transports offer, in paramiko's order. No certificate types:
# paramiko cannot verify a host certificate, so neither path asks for one.
HOST_KEY_ALGORITHMS = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
    "rsa-sha2-256",
)


class HostKeyChangedError(HostKeyError):
    """The host offers another key than the one recorded: kept connections to it must end."""


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


def _algorithms_of(keytype: str) -> list[str]:
    if keytype == "ssh-rsa":
        return ["rsa-sha2-512", "rsa-sha2-256"]
    return [keytype] if keytype in HOST_KEY_ALGORITHMS else []


@dataclass(frozen=True)
class KnownKey:
    keytype: str
    blob: bytes
    line: int
    marker: str | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)


def host_key_algorithms(recorded: list[KnownKey]) -> list[str]:
    """What both transports offer: the recorded keys' algorithms (the server must show one of
    those), else, with none recorded or none of a supported type, all of them."""
    wanted = {a for key in recorded for a in _algorithms_of(key.keytype)}
    return [a for a in HOST_KEY_ALGORITHMS if a in wanted] or list(HOST_KEY_ALGORITHMS)


@dataclass(frozen=True)
class _Line:
    """A known_hosts line split, its key not decoded yet (most lines name other hosts)."""

    marker: str | None
    field: str
    keytype: str
    b64: str
    number: int

    def key(self) -> KnownKey | None:
        """The line's key; None when its base64 is bad or names another type (OpenSSH skips
        such lines too)."""
        try:
            blob = base64.b64decode(self.b64, validate=True)
        except (ValueError, binascii.Error):
            return None
        if key_type_of(blob) != self.keytype:
            return None
        return KnownKey(self.keytype, blob, self.number, self.marker)


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
        pattern = pattern[1:] if negated else pattern
        if pattern == name or ("*" in pattern or "?" in pattern) and _glob(pattern).match(name):
            if negated:
                return False
            matched = True
    return matched


def _read(path: Path) -> str:
    """The file's text; a missing file is empty. Never blocks: a FIFO, a device or a folder is
    refused (opened non-blocking, then checked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise HostKeyError(f"cannot read known_hosts file {path}: {reason}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostKeyError(f"known_hosts file {path} is not a regular file; refusing to "
                               "read host keys from it", hint="point known_hosts at a file")
        data = os.read(fd, MAX_BYTES + 1)
    except OSError as exc:
        raise HostKeyError(f"cannot read known_hosts file {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise HostKeyError(f"known_hosts file {path} is larger than {MAX_BYTES >> 20} MiB")
    return data.decode("utf-8", errors="replace")


class KnownHosts:
    """One known_hosts file, read once; `append` writes a new line to it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lines: list[_Line] = []
        for number, raw in enumerate(_read(self.path).splitlines(), start=1):
            line = self._parse(raw, number)
            if line is not None:
                self._lines.append(line)

    @staticmethod
    def _parse(raw: str, number: int) -> _Line | None:
        parts = raw.split()
        if not parts or parts[0].startswith("#"):
            return None
        marker = None
        if parts[0].startswith("@"):
            marker, parts = parts[0], parts[1:]
            if marker not in ("@revoked", "@cert-authority"):
                return None  # as OpenSSH: a line with an unknown marker is skipped
        if len(parts) < 3:
            return None  # malformed lines are skipped, as OpenSSH does
        return _Line(marker, parts[0], parts[1], parts[2], number)

    def _keys(self, marker: str | None, name: str | None = None) -> list[KnownKey]:
        """The valid keys of the lines with this marker (and naming `name`, if given)."""
        keys = (line.key() for line in self._lines if line.marker == marker
                and (name is None or _match_field(line.field, name)))
        return [k for k in keys if k is not None]

    def lookup(self, address: str, port: int) -> list[KnownKey]:
        """The keys recorded for this address and port (no marker lines)."""
        return self._keys(None, host_key_name(address, port))

    def revoked(self, blob: bytes) -> KnownKey | None:
        """The `@revoked` line of this key, whatever host it names."""
        return next((k for k in self._keys("@revoked") if k.blob == blob), None)

    def is_revoked(self, blob: bytes) -> bool:
        return self.revoked(blob) is not None

    def check(self, label: str, address: str, port: int, blob: bytes) -> None:
        """Accept the offered key only when this file records exactly it for this host and does
        not revoke it; else the HostKeyError both transports raise."""
        name = host_key_name(address, port)
        revoked = self.revoked(blob)
        if revoked is not None:
            raise revoked_key_error(label, name, blob, self.path, revoked.line)
        recorded = self.lookup(address, port)
        if any(k.blob == blob for k in recorded):
            return
        if recorded:
            raise changed_key_error(label, name, blob, recorded, self.path)
        raise self.unknown_error(label, address, port, blob)

    def unknown_error(self, label: str, address: str, port: int,
                      blob: bytes | None) -> HostKeyError:
        """No key recorded for the host: why (a port-less line, a @cert-authority line)."""
        name = host_key_name(address, port)
        offered = f" ({key_type_of(blob)} {fingerprint(blob)})" if blob else ""
        notes = []
        portless = self._keys(None, address) if port != 22 else []
        if portless:
            notes.append(f"{self.path} {_lines(portless)} records {address} without a port, which "
                         f"means port 22 only: for port {port} the key must be recorded as "
                         f"{name}")
        cas = self._keys("@cert-authority", name)
        if port != 22:
            cas += [k for k in self._keys("@cert-authority", address) if k not in cas]
        if cas:
            notes.append(f"{self.path} {_lines(cas)} names this host as @cert-authority, "
                         "but host certificates are not supported: paramiko cannot verify "
                         "them, so neither SSH path accepts a host on a certificate alone")
        message = f"{label}: the host key of {name} is not known{offered}; refusing to connect"
        return HostKeyError(
            "; ".join([message, *notes]),
            hint=f"check the key, then run `ddtree-deploy hosts trust {label}` (it records "
            f"the host's own key as {name} in {self.path})",
        )

    def pinned_text(self, address: str, port: int) -> str:
        """A known_hosts file for ssh with exactly what `check` accepts for this host, under
        PIN_ALIAS: its recorded keys, and every revoked key. Its first line names the host."""
        lines = [pinned_header(address, port)]
        lines += [f"{PIN_ALIAS} {k.keytype} {base64.b64encode(k.blob).decode()}"
                  for k in self.lookup(address, port)]
        lines += [f"@revoked * {k.keytype} {base64.b64encode(k.blob).decode()}"
                  for k in self._keys("@revoked")]
        return "\n".join(lines) + "\n"

    def append(self, address: str, port: int, keytype: str, blob: bytes) -> str:
        """Append `name keytype base64` to the file (created 0600 in a 0700 folder)."""
        from ddtree_deploy.errors import TransportError

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
        parsed = self._parse(line, 0)
        if parsed is not None:
            self._lines.append(parsed)
        return line


def _lines(keys: list[KnownKey]) -> str:
    return ("line " if len(keys) == 1 else "lines ") + ", ".join(str(k.line) for k in keys)


def pinned_header(address: str, port: int) -> str:
    """The first line of a pinned file: which host it is for (found again by
    `openssh.end_masters_for`)."""
    name = host_key_name(address.lower(), port).encode("unicode_escape").decode("ascii")
    return f"# ddtree-deploy pinned keys of {name}"


def changed_key_error(
    label: str, name: str, offered: bytes, known: list[KnownKey], path: Path
) -> HostKeyError:
    old = ", ".join(f"{k.keytype} {k.fingerprint} (line {k.line})" for k in known)
    return HostKeyChangedError(
        f"{label}: HOST KEY CHANGED for {name}: expected {old}; offered now "
        f"{key_type_of(offered)} {fingerprint(offered)}. Refusing to connect.",
        hint=f"if the change is expected (host reinstalled), remove the old line from {path}, "
        f"then run `ddtree-deploy hosts trust {label}`",
    )


def revoked_key_error(label: str, name: str, offered: bytes, path: Path,
                      line: int) -> HostKeyError:
    return HostKeyError(
        f"{label}: the host key of {name} ({key_type_of(offered)} {fingerprint(offered)}) is "
        f"marked @revoked in {path} (line {line}); refusing to connect"
    )


def no_common_type_error(label: str, name: str, recorded: list[KnownKey],
                         path: Path) -> HostKeyError:
    known = ", ".join(f"{k.keytype} {k.fingerprint} (line {k.line})" for k in recorded)
    return HostKeyChangedError(
        f"{label}: the host no longer offers a key of the type recorded for {name} "
        f"({known}); refusing to connect",
        hint=f"check the host; if it was reinstalled, remove the old line from {path}, then "
        f"run `ddtree-deploy hosts trust {label}`",
    )


# Where `hosts trust HOST` looks: a host of the hosts file, else an address --------------


@dataclass(frozen=True)
class TrustTarget:
    label: str
    address: str
    port: int
    known_hosts: Path
    connect_timeout: float = 10.0  # a host of the hosts file: its own connect_timeout


Resolver = Callable[[str], TrustTarget]

_ADDRESS = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9._:%-]*\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")
_BRACKETED = re.compile(r"\[(?P<addr>[^\]]+)\]:(?P<port>\d+)\Z")


def default_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


def _split_address(text: str) -> tuple[str, str, str]:
    """`host`, `host:port`, `[host]`, `[host]:port`, each after an optional `user@` ->
    (the text without the user, the address, the port's text), unchecked."""
    text = text.strip()
    if "@" in text:
        text = text.split("@", 1)[1]
    match = _BRACKETED.match(text)
    if match:
        return text, match["addr"], match["port"]
    if text.startswith("[") and text.endswith("]"):  # [::1]: the brackets without a port
        return text, text[1:-1], "22"
    if text.count(":") == 1:
        address, port_text = text.split(":")
        return text, address, port_text
    return text, text, "22"


def names_an_ip(text: str) -> bool:
    """Whether `text` (`addr`, `addr:port`, `[addr]`, `[addr]:port`, `user@...`) is an IP
    address, read as parse_address reads it."""
    try:
        ipaddress.ip_address(_split_address(text)[1])
    except ValueError:
        return False
    return True


def parse_address(text: str) -> tuple[str, int]:
    """`host`, `host:port`, `[host]:port` (IPv6 in brackets) -> (address, port)."""
    text, address, port_text = _split_address(text)
    # a name or an IPv4/IPv6 address (with its %scope): nothing else reaches the resolver,
    # ssh or a known_hosts line (a control character, '[' left over, a leading '-')
    if not _ADDRESS.match(address):
        raise UsageError(f"not a host address: {text!r}")
    if not _PORT.match(port_text) or not 0 < int(port_text) < 65536:  # "²".isdigit() is true
        raise UsageError(f"not a TCP port: {port_text!r} (in {text!r})")
    return address, int(port_text)


def default_resolver(host: str) -> TrustTarget:
    address, port = parse_address(host)
    return TrustTarget(host, address, port, default_known_hosts())


class TrustableHost(Protocol):
    """What trust needs of a host of the hosts file (config's HostSpec; the transport layer
    imports no config)."""

    @property
    def transport(self) -> str: ...
    @property
    def address(self) -> str | None: ...
    @property
    def port(self) -> int: ...
    @property
    def known_hosts(self) -> Path: ...
    @property
    def connect_timeout(self) -> float: ...


def trust_target(hosts: Mapping[str, TrustableHost] | None, host: str) -> TrustTarget:
    """A host of the hosts file (`hosts`, when there is one), else an address."""
    if hosts is not None and host in hosts:
        spec = hosts[host]
        if spec.transport == "local":
            raise UsageError(f"{host} is this machine (transport: local): it is reached "
                             "without SSH, so there is no host key to trust",
                             hint="to trust an SSH server on this machine, name its address: "
                                  "`ddtree-deploy hosts trust 127.0.0.1:PORT`")
        if not spec.address:
            raise UsageError(f"{host} is an ~/.ssh/config alias: trust it with ssh itself")
        return TrustTarget(host, spec.address, spec.port, spec.known_hosts,
                           spec.connect_timeout)
    return default_resolver(host)
