"""What every command shares: the hosts file, loaded once per invocation."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import typer

from ddtree_deploy.cli.text import plain
from ddtree_deploy.config.hosts import (
    EMBEDDED,
    FROM_CWD,
    FROM_XDG,
    LAB,
    NAMED,
    Config,
    load_config,
    locate_hosts_file,
)
from ddtree_deploy.errors import UsageError
from ddtree_deploy.resources import embedded_hosts_file

if TYPE_CHECKING:
    from rich.console import Console


MAX_WAIT_S = 86400.0  # a deadline or timeout flag: longer than a day is a typo, inf a hang
MAX_PID = 1 << 22  # Linux's largest process id (pid_max's limit)


class _LazyConsole:
    """A rich Console made on first use, so a command that prints plain JSON to a pipe never
    loads rich (about 15 ms of every start)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        self._console: Any = None

    def made(self) -> Console:
        if self._console is None:
            from rich.console import Console

            # text from outside is printed as text: no ":x:" made an emoji (rich's default),
            # as esc() keeps it from being markup
            options = {"emoji": False, **self._options}
            if os.environ.get("NO_COLOR"):  # no-color.org: no colour, and no bold or italic
                options.update(color_system=None, no_color=True)
            self._console = Console(**options)
        return cast("Console", self._console)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.made(), name)

    def unmade_stream(self) -> TextIO | None:
        """The stream the console will write to, while it is not made yet."""
        if self._console is not None:
            return None
        return sys.stderr if self._options.get("stderr") else sys.stdout


def console(**options: Any) -> Console:
    """A module's console (rich's Console options), made when first used."""
    return cast("Console", _LazyConsole(options))


def rich_console(con: Console) -> Console:
    """The Console itself, for handing to rich (progress bars, live displays)."""
    return con.made() if isinstance(con, _LazyConsole) else con


def _unmade_stream(con: Console) -> TextIO | None:
    return con.unmade_stream() if isinstance(con, _LazyConsole) else None


def is_tty(con: Console) -> bool:
    """Whether the console writes to a terminal (asked without making a lazy one)."""
    stream = _unmade_stream(con)
    return stream.isatty() if stream is not None else bool(con.is_terminal)


_FOUND = {
    FROM_CWD: "./hosts.yaml of this folder",
    FROM_XDG: "from the XDG config folder",
    EMBEDDED: "the embedded lab file, used when no --hosts, $DDTREE_DEPLOY_HOSTS, "
              "./hosts.yaml or XDG config file is found: its hosts are the lab's addresses; "
              "apply on it needs --lab",
}


def confirm(question: str, *, err: bool = False) -> bool:
    """typer.confirm, "no" by default; Ctrl-C at it stays Ctrl-C (130 and "interrupted", as
    anywhere), not typer's Abort, which prints "Aborted." first. End of input is still Abort."""
    try:
        return bool(typer.confirm(question, default=False, err=err))
    except typer.Abort as abort:
        if not isinstance(abort.__context__, KeyboardInterrupt):
            raise
        typer.echo(err=err)  # ends the question's line
        raise KeyboardInterrupt from None


def config_of(ctx: typer.Context) -> Config:
    """The validated hosts file named by --hosts (or found by discovery), cached on ctx."""
    root = ctx.find_root()
    obj = root.obj if isinstance(root.obj, dict) else {}
    if "config" not in obj:
        cli_path = obj.get("hosts")
        if cli_path is not None and not cli_path.strip():
            raise UsageError(f"--hosts {cli_path!r}: expected the path of a hosts file")
        if obj.get("lab") and cli_path is not None:
            raise UsageError("--lab and --hosts both name a hosts file: give one of them")
        if obj.get("lab"):
            path, source = embedded_hosts_file(), LAB
        else:
            path, source = locate_hosts_file(Path(cli_path) if cli_path else None)
        loaded = load_config(path)
        loaded.source = source
        if source not in NAMED:  # found, not named: say which file this run uses
            sys.stderr.write(plain(f"hosts file: {path} ({_FOUND[source]})") + "\n")
        obj["config"] = loaded
        root.obj = obj
    config: Config = obj["config"]
    return config


def host_path(value: str | None, flag: str) -> str | None:
    """A venv (or other folder) on a host, named on the command line: an absolute path (a
    relative one would be read against some folder: refused, not guessed), without '..'
    or a character a line, a unit or a shebang cannot carry (a line break forges a message,
    and the clone writes the path into its scripts' first line)."""
    from pathlib import PurePosixPath

    from ddtree_deploy.settings.values import unit_char_problem

    if value is None:
        return None
    if not value.startswith("/"):
        raise UsageError(f"{flag} {value!r}: expected an absolute path on the host")
    if ".." in PurePosixPath(value).parts:
        raise UsageError(f"{flag} {value!r}: expected a path without '..' (name the folder)")
    problem = unit_char_problem(value)
    if problem:
        raise UsageError(f"{flag} {value!r}: expected a path without control characters or "
                         f"line separators: it {problem}")
    return value


def hosts_or_all(config: Config, names: list[str] | None) -> list[str]:
    """The named hosts (each checked to exist), or every host in the file."""
    if names:
        for name in names:
            config.host(name)
        return names
    return list(config.hosts)


def raw_stream(con: Console) -> TextIO:
    """The stream a console writes to, for plain text printed past rich."""
    return _unmade_stream(con) or cast("TextIO", con.file)


WIDE_HELP = "on a terminal, tables at their full width (nothing folded); not on a " \
            "terminal they are plain rows anyway"


def print_results(con: Console, results: object, code: int = 0) -> None:
    """Under --json: the command's results in the one success document (cli/errdoc.py,
    docs/json.md), then exit with `code` when it is not 0, so the document's exit_code is
    always the process's. Plain text when stdout is a pipe or a file (fast, nothing to strip),
    highlighted by rich on a terminal. `results` is a JSON-able value.

    Both paths print the same ASCII text (errdoc.dumps): a host's controls (ESC, the 8-bit
    CSI U+009B, DEL) and bidirectional overrides (U+202E) come out as JSON escapes, never
    raw (cli/text.py's promise). rich's print_json is not used: it dumps with
    ensure_ascii=False."""
    from ddtree_deploy.cli import errdoc

    value = errdoc.success(results, code)
    if is_tty(con):
        from rich.highlighter import JSONHighlighter

        text = JSONHighlighter()(errdoc.dumps(value).rstrip("\n"))
        text.no_wrap, text.overflow = True, None
        con.print(text, soft_wrap=True)
    else:
        stream = raw_stream(con)
        stream.write(errdoc.dumps(value))
        stream.flush()
    if code:
        raise typer.Exit(int(code))


def host_failure(host: str, exc: Exception) -> dict[str, Any]:
    """A host that failed, inside a multi-host command's results: its name, and the error
    object and exit code a failure's document has."""
    from ddtree_deploy.cli import errdoc

    return {"host": host, "ok": False, "error": errdoc.exc_error(exc),
            "exit_code": int(getattr(exc, "exit_code", 1))}
