"""A command as data, and its rendering into one POSIX shell line.

A `Command` is an argv tuple plus optional sudo, env, cwd, stdin and the secret values
to hide. It renders to one POSIX-shell-safe string: every element is quoted, so hostile
values are passed as data and never executed; `display()` shows it with the secrets
masked. `wrap_raw` bounds a raw shell line (a plain str given to run) the same way.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

KILL_AFTER = 2.0  # seconds between TERM and KILL once a command's timeout passes
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MASK = "***"
# A service's secrets digest read from its host (`scrypt$<salt hex>$<hash hex>`,
# service/endpoint.py) is masked by its form wherever output is shown or logged: the value is
# not known before the host answers, and plan's read of it (facts probe or sudo) is a command
# like any other (apply -v/-vv, the run log, an error's output).
DIGEST_FORM = re.compile(r"scrypt\$[^\s\"'\\,}\]]*")


def mask_secrets(text: str, secrets: Iterable[str]) -> str:
    """`text` with each of `secrets` and every secrets digest shown as ***."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return DIGEST_FORM.sub(MASK, text)


@dataclass(frozen=True)
class Command:
    """One program run with arguments; never interpolated into shell code."""

    argv: tuple[str, ...]
    sudo: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stdin: bytes | None = None
    secrets: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        argv = tuple(self.argv)
        if not argv:
            raise ValueError("a Command needs at least the program name")
        for value in (*argv, *self.env.keys(), *self.env.values(), self.cwd or ""):
            if not isinstance(value, str):
                raise TypeError(f"command values must be str, got {type(value).__name__}")
            if "\0" in value:
                raise ValueError("command values cannot contain NUL bytes")
        for name in self.env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"invalid environment variable name: {name!r}")
        if self.env and "=" in argv[0]:
            raise ValueError(f"program name cannot contain '=' with env set: {argv[0]!r}")
        object.__setattr__(self, "argv", argv)
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "secrets", frozenset(self.secrets))

    @classmethod
    def of(cls, *argv: str, **kwargs: object) -> Command:
        """`Command.of("ls", "-l", cwd="/tmp")`: argv given positionally."""
        return cls(argv=argv, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def shell(cls, script: str, *args: str, **kwargs: object) -> Command:
        """A shell script whose values arrive as "$1", "$2", ... (never interpolated)."""
        return cls(argv=("sh", "-c", script, "sh", *args), **kwargs)  # type: ignore[arg-type]

    def render(self, *, sudo: bool | None = None, timeout: float | None = None) -> str:
        """The command as one POSIX shell string.

        `sudo` overrides the command's own flag (a transport passes False when
        it already runs as root); `timeout` wraps the program in coreutils
        `timeout`, which kills the whole process group when the time is up.
        """
        return self._render(self.argv, self.env, self.cwd, sudo, timeout)

    def display(self) -> str:
        """The rendered command with every secret value replaced by '***'."""
        argv = tuple(mask_secrets(a, self.secrets) for a in self.argv)
        env = {k: mask_secrets(v, self.secrets) for k, v in self.env.items()}
        cwd = mask_secrets(self.cwd, self.secrets) if self.cwd is not None else None
        return self._render(argv, env, cwd, None, None)

    def _render(
        self,
        argv: tuple[str, ...],
        env: Mapping[str, str],
        cwd: str | None,
        sudo: bool | None,
        timeout: float | None,
    ) -> str:
        words: list[str] = []
        if sudo if sudo is not None else self.sudo:
            words += ["sudo", "-n", "--"]
        if timeout is not None:
            words += ["timeout", "-k", f"{KILL_AFTER:g}", f"{max(timeout, 0.001):.3f}"]
        if env:
            words += ["env", *(f"{k}={v}" for k, v in env.items())]
        words += argv
        line = " ".join(shlex.quote(w) for w in words)
        if timeout is not None:
            line = "exec " + line
        if cwd is not None:
            target = cwd if not cwd.startswith("-") else "./" + cwd
            line = f"cd -- {shlex.quote(target)} && {line}"
        return line


def wrap_raw(script: str, *, timeout: float | None) -> str:
    """A raw shell line (a plain str given to run), bounded by `timeout` if set."""
    if timeout is None:
        return script
    limit = f"{max(timeout, 0.001):.3f}"
    return f"exec timeout -k {KILL_AFTER:g} {limit} sh -c {shlex.quote(script)}"
