"""A service's endpoint: the address it binds, the user it runs as, and its secrets.

The default bind stays 0.0.0.0 (every interface: the story's clients are on the network);
a deployment's `bind:` changes it and `user:` names the user the server runs as (default
root). Secrets never reach argv, a unit, the journal or a log:

- the API key goes into a YAML file of mode 0600 (owned by the service's user) that SGLang
  reads with `--config FILE` (it reads its key only from `--api-key` or such a file);
- HF_TOKEN (a gated model's download) into an EnvironmentFile= of mode 0600 (systemd reads
  it as root before it starts the server; plain mode reads it the same way);
- SGLang logs its whole ServerArgs at start-up (`server_args=ServerArgs(..., api_key=...)`,
  engine.py): with a key, the unit runs SGLang through a small launcher (remote/serve.py)
  that shows the key as '<hidden>' in that text before `sglang.launch_server` starts.

Each comes from a file on the workstation (`api_key_file:`, `hf_token_file:` of the
deployment), read when the unit is installed; the files on the host live in
/etc/ddtree-deploy/services/<unit stem>/.

A changed key or token restarts the service: next to the secret files, a root-only file
(mode 0600, `secrets.sha256`, a name kept from its first form) holds a digest of their
content, `scrypt$<salt hex>$<hash hex>`: scrypt (slow by design) over the service's name and
the secrets, with a random salt drawn at each install. plan reads it as root (the facts
probe, or sudo when the probe cannot: converge/hoststate.py) and recomputes it on the
workstation with that salt from the workstation's files, so plan writes nothing and the
unit, which any local user can read, carries nothing derived from a secret. The digest is
never printed: inventory --json leaves it out, and what apply shows or logs of the commands
that read it (-v, -vv, errors, the run log) has it as *** by its form (transport/command.py);
should it leak, a weak key still costs scrypt's work per guess.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from ddtree_deploy.config.yamlload import read_config_bytes
from ddtree_deploy.errors import ConfigError
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport

DEFAULT_BIND = "0.0.0.0"
ROOT = "/etc/ddtree-deploy/services"
OPEN_BINDS = ("0.0.0.0", "::", "[::]")  # every interface


@dataclass(frozen=True)
class Secrets:
    """The secret values of one service, read from the workstation's files (never printed)."""

    api_key: str | None = None
    hf_token: str | None = None

    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k, v in (("api_key", self.api_key), ("hf_token", self.hf_token)) if v)

    def __repr__(self) -> str:  # never the values
        return f"Secrets({', '.join(self.kinds()) or 'none'})"


def folder(stem: str) -> str:
    return posixpath.join(ROOT, stem)


def config_file(stem: str) -> str:
    """The YAML file SGLang reads with --config (the API key)."""
    return posixpath.join(folder(stem), "server.yaml")


def env_file(stem: str) -> str:
    """The EnvironmentFile= of the unit (HF_TOKEN)."""
    return posixpath.join(folder(stem), "environment")


def launcher(stem: str) -> str:
    """The launcher that hides the key in SGLang's start-up log line (remote/serve.py)."""
    return posixpath.join(folder(stem), "serve.py")


def is_open(bind: str) -> bool:
    return bind in OPEN_BINDS


MAX_SECRET_BYTES = 64 << 10  # a key or token is a line; this bounds what is read to find it


def _read_secret(path: Path | None, what: str, field: str) -> str | None:
    if path is None:
        return None
    try:  # bounded and regular only: a FIFO would hang, /dev/zero fill the memory
        raw = read_config_bytes(path, "a regular file", limit=MAX_SECRET_BYTES)
    except ConfigError as exc:  # "PATH: no such file", "PATH: larger than 64 KiB, ..."
        raise ConfigError(f"{field}: cannot read the {what} from {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # the codec's message would show a byte of the secret
        raise ConfigError(f"{field}: {path} must hold the {what} as UTF-8 text (its content "
                          "is not shown)") from None
    value = text.strip()
    if not value or "\n" in value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ConfigError(f"{field}: {path} must hold the {what} on one line, printable "
                          "characters only (its content is not shown)")
    return value


def read_secrets(api_key_file: Path | None, hf_token_file: Path | None,
                 deployment: str) -> Secrets:
    """The deployment's secrets from its files on the workstation."""
    where = f"deployments.{deployment}"
    return Secrets(_read_secret(api_key_file, "API key", f"{where}.api_key_file"),
                   _read_secret(hf_token_file, "HF_TOKEN", f"{where}.hf_token_file"))


DIGEST_NAME = "secrets.sha256"


def digest_file(stem: str) -> str:
    """The root-only file (0600) holding the digest of the service's secrets."""
    return posixpath.join(folder(stem), DIGEST_NAME)


#: scrypt's cost (2**14 x 8: 16 MiB and some 50 ms a digest, as for an interactive login)
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
SALT_BYTES = 16


def _scrypt(secrets: Secrets, stem: str, salt: bytes) -> str:
    material = json.dumps([stem, secrets.api_key, secrets.hf_token]).encode()
    return hashlib.scrypt(material, salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P,
                          dklen=32).hex()


def secrets_digest(secrets: Secrets, stem: str, salt: bytes | None = None) -> str | None:
    """The digest kept on the host in digest_file (root-only, never in the unit, never
    printed): `scrypt$<salt hex>$<hash hex>` of the service's name and the secrets, with a
    fresh random salt unless one is given; None without secrets."""
    if not secrets.kinds():
        return None
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return f"scrypt${salt.hex()}${_scrypt(secrets, stem, salt)}"


def secrets_match(secrets: Secrets, stem: str, stored: str | None) -> bool:
    """Whether the digest read from the host (`stored`, None when there is none) is that of
    `secrets` for the service `stem`: recomputed with its salt. A digest of another form
    (the first tool's SHA-256) never matches: apply installs the files again."""
    if not secrets.kinds():
        return stored is None
    kind, _, rest = (stored or "").partition("$")
    salt_hex, _, want = rest.partition("$")
    try:
        salt = bytes.fromhex(salt_hex)
    except ValueError:
        return False
    if kind != "scrypt" or not salt or not want:
        return False
    return hmac.compare_digest(_scrypt(secrets, stem, salt), want)


def _put(t: ExecTransport, data: bytes, path: str, mode: int, owner: str | None) -> None:
    t.put_stream(io.BytesIO(data), path, mode=mode, sudo=True)
    if owner:
        t.run(Command.of("chown", "--", owner, path, sudo=True), timeout=30).check()


def install_secrets(t: ExecTransport, stem: str, secrets: Secrets, user: str | None) -> None:
    """Write the service's secret files (0600; the config file owned by the server's user),
    the launcher with them, and their digest (root-only); remove those no longer wanted.
    Nothing is written for a service without secrets."""
    from ddtree_deploy.remote.bundle import text

    base = folder(stem)
    if not secrets.kinds():
        t.run(Command.of("rm", "-rf", "--", base, sudo=True), timeout=30).check()
        return
    t.run(Command.shell('umask 022; mkdir -p -- "$1" && chmod 755 "$1"', base, sudo=True),
          timeout=30).check()
    if secrets.api_key:
        body = f"api-key: {json.dumps(secrets.api_key)}\n"  # a JSON string is a YAML scalar
        _put(t, body.encode(), config_file(stem), 0o600, user)
        _put(t, text("serve.py").encode(), launcher(stem), 0o644, None)
    if secrets.hf_token:
        _put(t, f"HF_TOKEN={secrets.hf_token}\n".encode(), env_file(stem), 0o600, None)
    _put(t, f"{secrets_digest(secrets, stem)}\n".encode(), digest_file(stem), 0o600, None)
    gone = [p for p, keep in ((config_file(stem), secrets.api_key),
                              (launcher(stem), secrets.api_key),
                              (env_file(stem), secrets.hf_token)) if not keep]
    if gone:
        t.run(Command.of("rm", "-f", "--", *gone, sudo=True), timeout=30).check()


def read_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines of an EnvironmentFile= (plain mode reads it as systemd does)."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line and not line.startswith(("#", ";")) and "=" in line:
                key, _, value = line.partition("=")
                out[key.strip()] = value.strip()
    return out
