"""Commands over the OpenSSH client, through a master connection kept open between runs.

Reading a host (facts for inventory, doctor, plan) is one short command. A new SSH
connection costs more than that command: key exchange and authentication on both ends,
and on the host sshd's fork, PAM and a login session. Like Ansible, this transport keeps
one OpenSSH master connection per host open for `persist` seconds after its last use
(ControlMaster/ControlPersist), so later commands, also from later runs of the tool, open
only a session on it.

Each command is one `ssh` run with ControlMaster=auto: through the master when one answers,
else that run connects and leaves the master behind. Exit 255 is the command's own status
while the master answers; otherwise it is ssh's own failure, mapped here from what ssh printed:
unreachable, host key unknown/changed/revoked, authentication, connection lost.

Host keys: ssh never reads the host's known_hosts file itself. hostkeys.KnownHosts reads it, as
for the paramiko transport, and writes the keys it accepts for this host to a pinned file
beside the master's socket (`kh-...`, the host's name on its first line), which ssh checks
strictly under a fixed HostKeyAlias, offering the host key algorithms paramiko offers. When
ssh refuses the key, the offered key is read again (without authenticating) to raise the
very error the paramiko transport raises; a changed key ends every master kept to that host.

Masters' sockets live in a private folder of the user (mode 0700); `disconnect` ends them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import BinaryIO

from ddtree_deploy.errors import AuthError, HostKeyError, TransportError, UnreachableError
from ddtree_deploy.transport.base import ExecTransport, RawOutcome, Tap
from ddtree_deploy.transport.hostkeys import (
    PIN_ALIAS,
    HostKeyChangedError,
    KnownHosts,
    host_key_algorithms,
    host_key_name,
    no_common_type_error,
    pinned_header,
)
from ddtree_deploy.transport.local import run_process

SSH_LOST = 255  # what ssh exits with when it, not the command, failed

# OpenSSH's default ciphers, AES-GCM first (the client's order picks): a bulk stream costs
# ~1.3 CPU-s/GB less on the workstation (client + master) and ~0.9-1 less per sshd than the
# default chacha20-poly1305 on CPUs with AES-NI, 340-445 vs 250-275 MB/s single-stream
# (benchmarks/RESULTS.md, overlay, run F). A server without AES-GCM negotiates as before.
# Offered only as far as this ssh knows them (`ssh -Q cipher`: a name it does not know is fatal
# to every command) and only with AES-GCM among them; a host that loads its ssh_config
# (ssh_alias) keeps what that says (a -o would stand over its Ciphers line).
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
           "aes128-ctr", "aes192-ctr", "aes256-ctr")


def offered_ciphers(known: set[str] | frozenset[str]) -> list[str]:
    """CIPHERS this client knows, in their order; none where no AES-GCM would be among them."""
    offer = [c for c in CIPHERS if c in known]
    return offer if any(c.endswith("-gcm@openssh.com") for c in offer) else []


def client_ciphers(ssh: str) -> frozenset[str]:
    """The ciphers this ssh client supports (`ssh -Q cipher`); empty where it cannot say."""
    try:
        done = subprocess.run([ssh, "-Q", "cipher"], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    if done.returncode != 0:
        return frozenset()
    return frozenset(done.stdout.decode("utf-8", "replace").split())


# A socket path holds at most 103 bytes (104 on BSD and macOS, with the NUL); ssh binds the
# master on the name plus "." and 16 random characters before renaming it.
SOCKET_PATH_MAX = 103 - 17
SOCKET_NAME_LEN = len("cm-") + 20


_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./+-]+")


def control_dir(create: bool = True) -> Path:
    """The user's private folder for master sockets: under $XDG_RUNTIME_DIR, else the temporary
    folder, else /tmp, the first where a socket's path stays short enough. Made when `create`
    (else only checked where it exists: a command that ends connections makes nothing)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    bases = [Path(runtime)] if runtime and Path(runtime).is_dir() else []
    bases += [Path(tempfile.gettempdir()), Path("/tmp")]  # noqa: S108 - a private folder in it
    name = f"ddtree-deploy-ssh-{os.getuid()}"
    fits = [b for b in bases if len(str(b / name)) + 1 + SOCKET_NAME_LEN <= SOCKET_PATH_MAX
            and _PLAIN_PATH.fullmatch(str(b))]  # ssh expands %, splits at spaces
    if not fits:
        raise TransportError(f"no folder short enough for SSH control sockets ({bases[0]})")
    return _private(fits[0] / name, create)


def _private(folder: Path, create: bool) -> Path:
    try:
        if create:
            folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except FileNotFoundError:
        if not create:
            return folder
        raise TransportError(f"cannot make the SSH control folder {folder}") from None
    except OSError as exc:
        raise TransportError(f"cannot make the SSH control folder {folder}: {exc}") from exc
    if not folder.is_dir() or folder.is_symlink() or info.st_uid != os.getuid() \
            or info.st_mode & 0o077:
        raise TransportError(f"{folder} is not a private folder of this user; refusing to "
                             "keep SSH connections in it", hint=f"remove {folder}")
    return folder


def available() -> bool:
    """Whether the OpenSSH client is installed on this machine."""
    return shutil.which("ssh") is not None


class OpenSshTransport(ExecTransport):
    """`run` and streams through `ssh`, multiplexed over a master kept `persist` seconds."""

    def __init__(
        self,
        target: str,
        *,
        known_hosts: Path,
        port: int | None = None,
        user: str | None = None,
        identity_file: str | Path | None = None,
        connect_timeout: float = 10.0,
        persist: float = 60.0,
        load_ssh_config: bool = False,
        ssh_config: Path | None = None,
        name: str | None = None,
    ) -> None:
        ssh = shutil.which("ssh")
        if ssh is None:
            raise TransportError("the OpenSSH client (ssh) is not installed on this machine",
                                 hint="install openssh-client, or set ssh_persist: 0 "
                                 "for the host")
        self.host = name or target
        self.target = target
        self.known_hosts = Path(known_hosts)
        self.user = user
        self.connect_timeout = float(connect_timeout)
        self._where = f"{self.host} ({target}{'' if port is None else f':{port}'})"
        parts = (user, target, port, known_hosts, identity_file, load_ssh_config)
        key = "\0".join(str(x) for x in (*parts, *([ssh_config] if ssh_config else [])))
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        folder = control_dir(create=False)  # made before the first ssh runs (_pin)
        self.control_path = folder / f"cm-{digest}"
        self.pinned_path = folder / f"kh-{digest}"
        self._ssh = ssh
        self._port = port
        self._load_ssh_config = load_ssh_config or ssh_config is not None
        self._algorithms: list[str] | None = None  # once the pinned file is written
        self._ciphers: list[str] | None = None  # once asked of the client (cipher_options)
        self._endpoint: tuple[str, int, bool] | None = None
        # as paramiko: no ~/.ssh/config unless asked; ssh_config: that file instead
        opts = ["-F", str(ssh_config or "none")] if ssh_config or not load_ssh_config else []
        if port is not None:
            opts += ["-p", str(port)]
        if user is not None:
            opts += ["-l", user]
        if identity_file is not None:
            opts += ["-i", str(identity_file), "-o", "IdentitiesOnly=yes"]
        self._config_opts = list(opts)
        opts += [
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"HostKeyAlias={PIN_ALIAS}",
            "-o", f"UserKnownHostsFile={self.pinned_path}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            # only that file, never written (older clients' defaults add IP lines, rotate
            # keys or ask DNS): as the paramiko transport checks
            "-o", "CheckHostIP=no",
            "-o", "UpdateHostKeys=no",
            "-o", "VerifyHostKeyDNS=no",
            "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            "-o", "ServerAliveInterval=15",
            "-o", "ServerAliveCountMax=3",
            "-o", "LogLevel=ERROR",
            "-S", str(self.control_path),
        ]  # fmt: skip
        self._base = [ssh, *opts]
        self._persist = max(1, round(persist))
        self._closed = False
        self._uid: int | None = 0 if user == "root" else None

    # -- host keys ------------------------------------------------------------

    def endpoint(self) -> tuple[str, int, bool]:
        """(address, port) ssh connects to, and whether directly: for an ~/.ssh/config alias
        as `ssh -G` reads it (HostName, Port, ProxyJump/ProxyCommand)."""
        if self._endpoint is None:
            if not self._load_ssh_config:
                self._endpoint = (self.target, self._port or 22, True)
            else:
                self._endpoint = self._resolve()
        return self._endpoint

    def cipher_options(self) -> list[str]:
        """`-o Ciphers=...` with AES-GCM first (CIPHERS says why), or nothing: a host that
        loads its ssh_config, or a client without AES-GCM. Asked of the client once."""
        if self._ciphers is None:
            self._ciphers = [] if self._load_ssh_config \
                else offered_ciphers(client_ciphers(self._ssh))
        return ["-o", f"Ciphers={','.join(self._ciphers)}"] if self._ciphers else []

    def _resolve(self) -> tuple[str, int, bool]:
        try:
            done = subprocess.run([self._ssh, *self._config_opts, "-G", "--", self.target],
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise TransportError(f"{self._where}: `ssh -G` did not answer") from exc
        found = dict(line.split(" ", 1) for line in done.stdout.decode("utf-8", "replace")
                     .splitlines() if " " in line)
        if done.returncode != 0 or "hostname" not in found:
            raise TransportError(f"{self._where}: cannot read its SSH settings: "
                                 f"{_last_line(done.stderr.decode('utf-8', 'replace'))}")
        direct = found.get("proxycommand", "none") == "none" \
            and found.get("proxyjump", "none") == "none"
        return found["hostname"], int(found.get("port", "22")), direct

    def _pin(self) -> list[str]:
        """Write the pinned file (when its text changed); the host key algorithms to offer."""
        if self._algorithms is None:
            _private(self.pinned_path.parent, create=True)
            address, port, _ = self.endpoint()
            known = KnownHosts(self.known_hosts)
            text = known.pinned_text(address, port)
            try:
                old = self.pinned_path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                old = None
            if old != text:
                fd, tmp = tempfile.mkstemp(dir=self.pinned_path.parent, prefix=".kh-")
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as fh:
                        fh.write(text)
                    os.replace(tmp, self.pinned_path)
                except OSError as exc:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise TransportError(f"cannot write {self.pinned_path}: {exc}") from exc
            self._algorithms = host_key_algorithms(known.lookup(address, port))
        return self._algorithms

    def _host_key_error(self, text: str, fallback: TransportError) -> TransportError:
        """ssh refused the host key (or failed without saying why: it logs a failed algorithm
        negotiation below LogLevel ERROR): the paramiko transport's error for the same key,
        read again without authenticating where ssh connects directly, else ssh's words."""
        from ddtree_deploy.transport.hostscan import scan_key

        address, port, direct = self.endpoint()
        known = KnownHosts(self.known_hosts)
        recorded = known.lookup(address, port)
        name = host_key_name(address, port)
        error: TransportError = fallback
        if "no matching host key type" in text and recorded:
            error = no_common_type_error(self.host, name, recorded, known.path)
        elif direct:
            try:
                key = scan_key(self.host, address, port, timeout=self.connect_timeout,
                               algorithms=host_key_algorithms(recorded))
                known.check(self.host, address, port, key.asbytes())
            except HostKeyError as exc:
                error = exc
            except TransportError as exc:
                if recorded and "host key" in str(exc).lower():
                    error = no_common_type_error(self.host, name, recorded, known.path)
                # else: gone since, or not SSH: ssh's own words
        if isinstance(error, HostKeyChangedError) or "IDENTIFICATION HAS CHANGED" in text:
            end_masters_for(address, port)
        return error

    # -- the master -----------------------------------------------------------

    def _control(self, op: str, timeout: float = 5.0) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*self._base, "-O", op, "--", self.target], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, check=False)

    def alive(self) -> bool:
        """Whether a master for this host answers on the control socket."""
        if not self.control_path.exists():
            return False
        try:
            return self._control("check").returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def disconnect(self) -> bool:
        """End this host's master connection; True if one was running."""
        if not self.control_path.exists():
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self._control("exit").returncode == 0
        return False

    def close(self) -> None:
        """Done with this object; the master stays open for `persist` seconds."""
        self._closed = True

    # -- running --------------------------------------------------------------

    def _is_root(self) -> bool:
        if self._uid is None:
            self._uid = self._remote_uid(max(self.connect_timeout, 10.0))
        return self._uid == 0

    def _exec(
        self,
        script: str,
        *,
        stdin: BinaryIO | None,
        stdout: BinaryIO | None,
        deadline: float | None,
        live: Tap | None = None,
    ) -> RawOutcome:
        if self._closed:
            raise TransportError(f"{self._where}: the connection was closed")
        # auto: through the master when one answers, else this ssh connects, forks the master
        # to the background (its output to /dev/null) and runs the command through it. A stale
        # socket is removed by ssh itself.
        algorithms = ",".join(self._pin())
        argv = [*self._base, *self.cipher_options(), "-o", f"HostKeyAlgorithms={algorithms}",
                "-o", "ControlMaster=auto",
                "-o", f"ControlPersist={self._persist}s", "-T", "-e", "none", "--", self.target,
                script]
        # Killing the client at the deadline ends the session; the host's side is bounded by
        # the command's own timeout wrapper.
        outcome = run_process(argv, stdin=stdin, stdout=stdout, deadline=deadline,
                              own_group=False, host=self.host, live=live)
        if outcome.exit_code == SSH_LOST:
            text = outcome.stderr.decode("utf-8", "replace")
            if "session request failed" in text or "Session open refused" in text:
                raise TransportError(f"{self._where}: the server refused a session: "
                                     f"{_last_line(text)}")
            if not self.alive():  # ssh's own failure: connecting, or the connection was lost
                error = map_ssh_error(self.host, self._where, text, self.known_hosts,
                                      self.connect_timeout)
                if isinstance(error, HostKeyError) or type(error) is TransportError:
                    error = self._host_key_error(text, error)
                raise error
            # else: the command itself exited 255 (or was killed by a signal)
        return outcome


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "ssh exited 255 with no message"


_NOT_SSH = re.compile(r"kex_exchange_identification: (Connection closed|read: Connection reset)|"
                      r"banner exchange: .*invalid format")
_UNREACHABLE = re.compile(
    r"Connection refused|Connection timed out|No route to host|Network is unreachable|"
    r"Could not resolve hostname|Name or service not known|Connection closed by|"
    r"Connection reset by|kex_exchange_identification|banner exchange")


def map_ssh_error(label: str, where: str, text: str, known_hosts: Path,
                  timeout: float) -> TransportError:
    """What ssh printed when it could not connect -> the tool's error for it."""
    fpr = re.search(r"(SHA256:[A-Za-z0-9+/=]+)", text)
    offered = f" (offered: {fpr.group(1)})" if fpr else ""
    if "REVOKED HOST KEY" in text:
        return HostKeyError(f"{label}: the host key of {where} is marked @revoked in "
                            f"{known_hosts}{offered}")
    if "IDENTIFICATION HAS CHANGED" in text:
        line = re.search(r"Offending \S+ key in .*?:(\d+)", text)
        old = f" (recorded on line {line.group(1)})" if line else ""
        return HostKeyError(
            f"{label}: HOST KEY CHANGED for {where}{offered}{old}. Refusing to connect.",
            hint=f"if the change is expected (host reinstalled), remove the old line from "
            f"{known_hosts}, then run `ddtree-deploy hosts trust {label}`")
    if "Host key verification failed" in text or "host key is known" in text:
        return HostKeyError(
            f"{label}: the host key of {where} is not known{offered}; refusing to connect",
            hint=f"check the key, then run `ddtree-deploy hosts trust {label}` "
            f"(known_hosts file: {known_hosts})")
    if "Permission denied" in text or "Too many authentication failures" in text:
        return AuthError(f"{label}: authentication to {where} failed: {_last_line(text)}",
                         hint="check the user and identity file (and that its public key is "
                         "in the host's authorized_keys)")
    if _NOT_SSH.search(text):
        return UnreachableError(f"{where} unreachable: the server closed the connection without "
                                f"an SSH banner (is an SSH server on that port?): "
                                f"{_last_line(text)}")
    if _UNREACHABLE.search(text):
        return UnreachableError(f"{where} unreachable: {_last_line(text)} "
                                f"(connect timeout {timeout:g}s)")
    return TransportError(f"{where}: SSH connection failed: {_last_line(text)}")


def end_masters_for(address: str, port: int) -> int:
    """End every master kept to this host (any user, key or known_hosts file): their pinned
    files name it. How many answered."""
    header = pinned_header(address, port)
    try:
        folder = control_dir(create=False)
    except TransportError:
        return 0
    ended = 0
    for pinned in sorted(folder.glob("kh-*")):
        try:
            with pinned.open(encoding="utf-8", errors="replace") as fh:
                first = fh.readline().rstrip("\n")
        except OSError:
            continue
        sock = folder / f"cm-{pinned.name[3:]}"
        if first == header and sock.exists():
            ended += end_master(sock)
    return ended


def end_master(sock: Path) -> bool:
    """End the master listening on control socket `sock`; True if one answered."""
    ssh = shutil.which("ssh")
    ended = False
    if ssh is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            done = subprocess.run([ssh, "-F", "none", "-S", str(sock), "-O", "exit", "x"],
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=5.0,
                                  check=False)
            ended = done.returncode == 0
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    return ended


def disconnect_all() -> int:
    """End every master connection this user keeps; how many there were."""
    return sum(end_master(sock) for sock in sorted(control_dir(create=False).glob("cm-*")))
