"""A real OpenSSH sshd on 127.0.0.1 for tests: own host key, config and client key.

Needs root (sshd's privilege separation) and /usr/sbin/sshd. The daemon runs
in the foreground (`-D -e`) and is killed by its PID at stop().
"""

from __future__ import annotations

import base64
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def sshd_available() -> str | None:
    """None when a test sshd can run here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root to run sshd"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not installed"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not installed"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, keytype: str = "ed25519") -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", keytype, "-N", "", "-C", "test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


def public_blob(pub_path: Path) -> tuple[str, bytes]:
    keytype, b64 = pub_path.read_text().split()[:2]
    return keytype, base64.b64decode(b64)


def openssh_fingerprint(pub_path: Path) -> str:
    """The fingerprint as OpenSSH's own ssh-keygen prints it (SHA256:...)."""
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub_path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[1]


@dataclass
class Sshd:
    workdir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    users: list[str] = field(default_factory=list)
    max_sessions: int = 100
    host_ca: Path | None = None  # a CA key: the host also presents a certificate signed by it

    @property
    def host_key(self) -> Path:
        return self.workdir / "host_ed25519"

    @property
    def client_key(self) -> Path:
        return self.workdir / "client_ed25519"

    @property
    def auth_dir(self) -> Path:
        return self.workdir / "auth"

    def known_hosts_line(self) -> str:
        keytype, b64 = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {keytype} {b64}"

    def authorize(self, user: str, pub: Path | None = None) -> None:
        self.auth_dir.mkdir(exist_ok=True)
        source = pub or self.client_key.with_suffix(".pub")
        (self.auth_dir / user).write_text(source.read_text())

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        keygen(self.host_key)
        keygen(self.client_key)
        extra = []
        if self.host_ca is not None:
            subprocess.run(["ssh-keygen", "-q", "-s", str(self.host_ca), "-I", "test-host", "-h",
                            "-n", "127.0.0.1", str(self.host_key.with_suffix(".pub"))],
                           check=True, stdin=subprocess.DEVNULL, capture_output=True)
            extra.append(f"HostCertificate {self.host_key}-cert.pub")
        self.authorize("root")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        self.port = free_port()
        config = self.workdir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress 127.0.0.1:{self.port}",
                    f"HostKey {self.host_key}",
                    "PidFile none",
                    "UsePAM no",
                    "StrictModes no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    f"AuthorizedKeysFile {self.auth_dir}/%u .ssh/authorized_keys",
                    "PermitRootLogin prohibit-password",
                    "PermitUserEnvironment yes",
                    "AllowTcpForwarding yes",
                    "MaxStartups 100",
                    f"MaxSessions {self.max_sessions}",
                    "LogLevel ERROR",
                    f"Subsystem sftp {SFTP_SERVER}",
                    *extra,
                    "",
                ]
            )
        )
        subprocess.run([SSHD, "-t", "-f", str(config)], check=True)
        log = (self.workdir / "sshd.log").open("wb")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()
        self._wait_banner()

    def _wait_banner(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.workdir / 'sshd.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-2.0"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not answer within 10s")

    def add_user(self, name: str, *, path_dirs: list[str] | None = None) -> Path:
        """A throwaway login user with our client key; removed at stop()."""
        subprocess.run(
            ["useradd", "-m", "-p", "*", "-s", "/bin/sh", name],
            check=True,
            capture_output=True,
        )
        self.users.append(name)
        entry = pwd.getpwnam(name)
        home = Path(entry.pw_dir)
        # sshd reads a user's keys as that user: they live in the user's home.
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        if path_dirs is not None:
            (ssh_dir / "environment").write_text("PATH=" + ":".join(path_dirs) + "\n")
        for path in (ssh_dir, *ssh_dir.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        return home

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.proc = None
        for name in self.users:
            subprocess.run(["userdel", "-r", "-f", name], capture_output=True, check=False)
        self.users.clear()
