"""The SSH transport, on fabric (config resolution) and paramiko (the wire).

Host keys are checked strictly against one known_hosts file, never added on
the fly; every paramiko, socket and OS error is mapped to ddtree_deploy.errors
here, so nothing else in the code base imports paramiko.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import fabric
import paramiko

from ddtree_deploy.errors import (
    AuthError,
    HostKeyError,
    RemoteCommandError,
    TransportError,
    UnreachableError,
)
from ddtree_deploy.transport.base import CHUNK, Capture, ExecTransport, RawOutcome, Tap
from ddtree_deploy.transport.hostkeys import (
    HostKeyChangedError,
    KnownHosts,
    host_key_algorithms,
    host_key_name,
    no_common_type_error,
)
from ddtree_deploy.transport.hostscan import (
    WIRE_LOG,
    connect_socket,
    handshake_error,
    new_transport,
)

EOF_GRACE = 1.0  # seconds of silence after the exit status before output counts as complete
Uploader = Callable[["SshTransport", BinaryIO, str, "int | None"], int]


class _Verify(paramiko.MissingHostKeyPolicy):
    """Replaces fabric's AutoAddPolicy. paramiko's own host keys are left empty, so it asks
    this for every key, before authenticating: the one check both SSH paths make
    (KnownHosts.check); nothing is ever added."""

    def __init__(self, label: str, address: str, port: int, known: KnownHosts) -> None:
        self._where = (label, address, port)
        self._known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        self._known.check(*self._where, key.asbytes())


def _fabric_config(ssh_config: Path | None, load_ssh_config: bool) -> fabric.Config:
    if ssh_config is not None:
        return fabric.Config(runtime_ssh_path=str(ssh_config))
    if not load_ssh_config:
        return fabric.Config(overrides={"load_ssh_configs": False})
    return fabric.Config()


class SshTransport(ExecTransport):
    """Commands and streams over one SSH connection, opened on first use.

    `host` may be an address, `user@host:port`, or an ~/.ssh/config alias
    (HostName, Port, User, IdentityFile and ProxyJump are honoured). `jump`
    is another SshTransport used as a gateway (ProxyJump style).
    """

    def __init__(
        self,
        host: str,
        *,
        known_hosts: Path,
        port: int | None = None,
        user: str | None = None,
        identity_file: str | Path | None = None,
        connect_timeout: float = 10.0,
        jump: SshTransport | None = None,
        ssh_config: Path | None = None,
        load_ssh_config: bool = True,
        name: str | None = None,
        uploader: Uploader | None = None,
    ) -> None:
        self.known_hosts = Path(known_hosts)
        self.connect_timeout = float(connect_timeout)
        self._uploader = uploader
        connect_kwargs: dict[str, Any] = {}
        if identity_file is not None:
            connect_kwargs["key_filename"] = [str(identity_file)]
            connect_kwargs["look_for_keys"] = False
        try:
            self._conn = fabric.Connection(
                host,
                user=user,
                port=port,
                config=_fabric_config(ssh_config, load_ssh_config),
                connect_kwargs=connect_kwargs,
                gateway=False if jump is not None else None,
            )
        except (ValueError, OSError) as exc:
            raise TransportError(f"{name or host}: bad SSH settings: {exc}") from exc
        # fabric truncates connect_timeout to int and may take it from ssh config;
        # the socket and handshake timeouts are ours.
        self._conn.connect_timeout = None
        self.address: str = self._conn.host
        self.port: int = int(self._conn.port)
        self.user: str = self._conn.user
        self.host = name or host
        self._jump = jump
        self._owns_jump = False
        gateway = self._conn.gateway
        if jump is None and isinstance(gateway, fabric.Connection):
            self._jump = SshTransport(
                gateway.host,
                port=int(gateway.port),
                user=gateway.user,
                known_hosts=self.known_hosts,
                connect_timeout=connect_timeout,
                ssh_config=ssh_config,
                load_ssh_config=load_ssh_config,
            )
            self._owns_jump = True
        self._proxy_command = gateway if isinstance(gateway, str) else None
        self._lock = threading.Lock()
        self._closed = False  # by close(): no reconnecting after that (e.g. from a thread)
        self._uid: int | None = 0 if self.user == "root" else None

    # -- connection ---------------------------------------------------------

    def _where(self) -> str:
        return f"{self.host} ({self.address}:{self.port})"

    def _open_sock(self) -> Any:
        if self._jump is not None:
            jump = self._jump._ensure()
            try:
                return jump.open_channel(
                    "direct-tcpip",
                    (self.address, self.port),
                    ("", 0),
                    timeout=self.connect_timeout,
                )
            except paramiko.ChannelException as exc:
                raise UnreachableError(
                    f"{self._where()} unreachable through {self._jump.host}: {exc.text}"
                ) from exc
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise UnreachableError(
                    f"{self._where()} unreachable through {self._jump.host}: "
                    f"{exc or type(exc).__name__} (connect timeout {self.connect_timeout:g}s)"
                ) from exc
        if self._proxy_command is not None:
            return self._conn.open_gateway()
        return connect_socket(self.host, self.address, self.port, self.connect_timeout)

    def _ensure(self) -> paramiko.Transport:
        with self._lock:
            if self._closed:
                raise TransportError(f"{self._where()}: the connection was closed")
            transport = self._conn.client.get_transport()
            if transport is not None and transport.is_active():
                return transport
            known = KnownHosts(self.known_hosts)
            try:
                self._connect(known)
                wire = self._conn.client.get_transport()
                assert wire is not None
                # again, should paramiko ever skip the policy (keys of its own loaded)
                known.check(self.host, self.address, self.port,
                            wire.get_remote_server_key().asbytes())
            except HostKeyChangedError:
                self._conn.client.close()
                from ddtree_deploy.transport.openssh import end_masters_for

                end_masters_for(self.address, self.port)  # facts must not read the old one
                raise
            except BaseException:
                self._conn.client.close()
                raise
            transport = self._conn.client.get_transport()
            assert transport is not None
            return transport

    def _connect(self, known: KnownHosts) -> None:
        client = self._conn.client
        client.get_host_keys().clear()
        client.set_missing_host_key_policy(_Verify(self.host, self.address, self.port, known))
        client.set_log_channel(WIRE_LOG)
        recorded = known.lookup(self.address, self.port)
        algorithms = host_key_algorithms(recorded)
        sock = self._open_sock()
        t = self.connect_timeout
        kwargs = dict(
            self._conn.connect_kwargs,
            hostname=self.address,
            port=self.port,
            username=self.user,
            sock=sock,
            timeout=t,
            banner_timeout=t,
            auth_timeout=t,
            channel_timeout=t,
            transport_factory=lambda s, **kw: new_transport(s, algorithms, **kw),
        )
        try:
            client.connect(**kwargs)
        except HostKeyError:
            raise
        except paramiko.BadHostKeyException as exc:  # only with keys loaded behind our back
            known.check(self.host, self.address, self.port, exc.key.asbytes())
            raise HostKeyError(f"{self._where()}: paramiko refused the host key: {exc}") from exc
        except paramiko.AuthenticationException as exc:
            raise AuthError(
                f"{self.host}: authentication as {self.user}@{self.address}:{self.port} "
                f"failed: {exc}",
                hint="check the user and identity file (and that its public key is in "
                "the host's authorized_keys)",
            ) from exc
        except paramiko.SSHException as exc:
            raise self._map_handshake(exc, known) from exc
        except (OSError, EOFError) as exc:
            raise UnreachableError(
                f"{self._where()} unreachable: connection lost during the SSH handshake "
                f"({exc or type(exc).__name__})"
            ) from exc

    def _map_handshake(self, exc: paramiko.SSHException, known: KnownHosts) -> TransportError:
        wire = self._conn.client.get_transport()
        version = wire.remote_version if wire is not None else None
        mapped = handshake_error(self._where(), exc, version, self.connect_timeout)
        if mapped is not None:
            return mapped
        recorded = known.lookup(self.address, self.port)
        if "host key" in str(exc).lower() and recorded:
            return no_common_type_error(self.host, host_key_name(self.address, self.port),
                                        recorded, known.path)
        return TransportError(f"{self._where()}: SSH connection failed: {exc}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.client.close()
        if self._owns_jump and self._jump is not None:
            self._jump.close()

    # -- running ------------------------------------------------------------

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
        transport = self._ensure()
        start = time.monotonic()
        try:
            chan = transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(script)
        except paramiko.ChannelException as exc:  # refused (e.g. MaxSessions): the rest is fine
            raise TransportError(f"{self._where()}: the server refused a session: {exc}") from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._conn.client.close()
            raise TransportError(f"{self._where()}: cannot start a command: {exc}") from exc
        try:
            return self._pump(chan, stdin, stdout, deadline, start, live)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self._where()}: connection failed mid-command: {exc}") from exc
        finally:
            chan.close()

    @staticmethod
    def _feed(chan: paramiko.Channel, src: BinaryIO, errors: list[BaseException]) -> None:
        try:
            while chunk := src.read(CHUNK):
                chan.sendall(chunk)
            chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the command stopped reading (or the channel closed): its exit code says why
        except BaseException as exc:  # a failing source: reported by the caller
            errors.append(exc)

    def _pump(
        self,
        chan: paramiko.Channel,
        stdin: BinaryIO | None,
        stdout: BinaryIO | None,
        deadline: float | None,
        start: float,
        live: Tap | None = None,
    ) -> RawOutcome:
        out = Capture(tap=None if live is None else lambda data: live("out", data))
        err = Capture(tap=None if live is None else lambda data: live("err", data))
        feed_errors: list[BaseException] = []
        feeder = None
        if stdin is None:
            chan.shutdown_write()
        else:
            feeder = threading.Thread(
                target=self._feed, args=(chan, stdin, feed_errors), daemon=True
            )
            feeder.start()
        timed_out = False
        last_data = time.monotonic()
        while True:
            while chan.recv_ready():
                data = chan.recv(CHUNK)
                last_data = time.monotonic()
                if stdout is None:
                    out.append(data)
                else:
                    stdout.write(data)
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(CHUNK))
                last_data = time.monotonic()
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                # sshd may report the exit status before the last output: wait for EOF,
                # unless a background process holds the output open (quiet for EOF_GRACE).
                drained = chan.eof_received or chan.closed
                if drained or time.monotonic() - last_data > EOF_GRACE:
                    break
            wait = 0.2
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                wait = min(wait, left)
            select.select([chan], [], [], wait)
        code = None if timed_out else chan.recv_exit_status()
        chan.close()
        if feeder is not None:
            feeder.join(timeout=5.0)
        if feed_errors:
            raise feed_errors[0]
        return RawOutcome(code, out.value(), err.value(), time.monotonic() - start, timed_out)

    # -- files --------------------------------------------------------------

    def put_stream(
        self,
        src: BinaryIO,
        remote_path: str,
        *,
        mode: int | None = None,
        sudo: bool = False,
    ) -> int:
        if self._uploader is not None and not sudo:
            return self._uploader(self, src, remote_path, mode)
        return super().put_stream(src, remote_path, mode=mode, sudo=sudo)

    def sftp(self) -> paramiko.SFTPClient:
        """An SFTP session on the open connection (for an alternative uploader)."""
        try:
            return self._ensure().open_sftp_client()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self._where()}: cannot open SFTP: {exc}") from exc


def sftp_upload(ssh: SshTransport, src: BinaryIO, remote_path: str, mode: int | None) -> int:
    """An uploader over SFTP: temporary name, chunked writes, chmod, rename."""
    tmp = f"{remote_path}.ddtree-tmp-{int(time.time() * 1000)}"
    sftp = ssh.sftp()
    count = 0
    try:
        with sftp.open(tmp, "wb") as fh:
            fh.set_pipelined(True)
            while chunk := src.read(CHUNK):
                fh.write(chunk)
                count += len(chunk)
        if mode is not None:
            sftp.chmod(tmp, mode)
        sftp.posix_rename(tmp, remote_path)
    except (OSError, paramiko.SSHException) as exc:
        with contextlib.suppress(OSError, paramiko.SSHException):
            sftp.remove(tmp)
        raise RemoteCommandError(f"{ssh.host}: could not write {remote_path}: {exc}") from exc
    finally:
        sftp.close()
    return count
