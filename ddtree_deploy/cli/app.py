"""The ddtree-deploy command line: thin (parse, call, render).

Every command shares the exit codes of errors.ExitCode; a DeployError becomes its
message and exit code, never a traceback. With --json, the error is also printed on
stdout as the one JSON document of a failure (cli/errdoc.py, docs/json.md), so a machine
reading stdout always gets JSON. Output that cannot be written (stdout on a full disk) is
one line on stderr and exit 1; Ctrl-C while the CLI is still starting exits 130.
"""

import contextlib
import errno
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

# Writing the output failed: the disk or quota is full, the device gives up, the reader left
# or the descriptor is gone.
_OUTPUT_LOST = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EPIPE, errno.EBADF)
_STREAMS = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))
# The widths rich and typer lay text out at ($COLUMNS, typer's $TERMINAL_WIDTH): narrower
# than MIN_WIDTH every box and cell folds to nothing (help, a usage error, a table lost),
# wider than MAX_WIDTH a line pads without end; a terminal wraps what is wider than it.
MIN_WIDTH, MAX_WIDTH = 40, 1000


# The commands in the order `--help` lists them: (name, module of ddtree_deploy.cli, attribute,
# whether it is a group); PLUGINS marks where the other distributions' groups go.
PLUGINS = "<plugins>"
COMMANDS: tuple[tuple[str, str, str, bool], ...] = (
    ("plan", "converge", "plan", False),
    ("apply", "converge", "apply", False),
    ("inventory", "inventory", "inventory", False),
    ("doctor", "inventory", "doctor", False),
    ("probe", "service", "probe", False),
    ("service", "service", "app", True),
    ("payload", "payload", "app", True),
    ("venv", "venv", "app", True),
    ("overlay", "overlay", "app", True),
    ("hosts", "hosts", "app", True),
    (PLUGINS, "", "", True),
    ("bench", "bench", "app", True),
)
BUILT_INS = frozenset(name for name, *_ in COMMANDS if name != PLUGINS)


def invoked(args: list[str]) -> str | None:
    """The built-in command `args` run (past the root's --hosts FILE), else None: no command,
    --help, --version, an unknown option, a plugin's group or a name that is no command."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--hosts":
            i += 2
        elif arg.startswith("--hosts="):
            i += 1
        elif arg.startswith("-"):
            return None
        else:
            return arg if arg in BUILT_INS else None
    return None


def root_options_first(args: list[str]) -> list[str]:
    """`--hosts FILE`, `--lab` and `--debug` given after a built-in command (`plan ct200
    --hosts f.yaml`) moved before it, where the root parses them; no built-in command has
    options of these names. Past `--`, and for plugins' groups (their own parsing), nothing
    moves."""
    end = args.index("--") if "--" in args else len(args)
    first = next((i for i, a in enumerate(args[:end]) if not a.startswith("-")
                  and (i == 0 or args[i - 1] != "--hosts")), None)
    if first is None or args[first] not in BUILT_INS:
        return args
    moved: list[str] = []
    rest: list[str] = []
    i = first + 1
    while i < end:
        arg = args[i]
        if arg == "--hosts" and i + 1 < end:
            moved += args[i:i + 2]
            i += 2
            continue
        if arg.startswith("--hosts=") or arg in ("--lab", "--debug"):
            moved.append(arg)
        else:
            rest.append(arg)
        i += 1
    return [*args[:first], *moved, args[first], *rest, *args[end:]]


def build_app(args: "list[str] | None" = None) -> "typer.Typer":
    """The Typer app (imported here: main() guards the imports). When `args` run a built-in
    command, only that command's module is imported and added: the others' imports, the
    plugins' lookup and typer's build of every command cost each run about 0.1-0.2 s, for
    commands this run cannot reach (click dispatches on the first word). Anything else (help,
    --version, a plugin, a typo) gets every command, so help and errors list them all."""
    import importlib

    import typer

    from ddtree_deploy import cli_plugins

    if os.environ.get("NO_COLOR"):  # help and usage errors too: no colour, bold or italic
        from typer import rich_utils

        rich_utils.COLOR_SYSTEM = None  # typer's documented switch
    from typer.core import TyperGroup

    from ddtree_deploy.cli import helptext

    class RootGroup(TyperGroup):
        """Under --json, a usage error (typer's, at any depth) is also a JSON document on
        stdout (cli/errdoc.py); typer still says it on stderr and exits with its code."""

        def make_context(self, *a: Any, **kw: Any) -> Any:
            helptext.prepare(self)  # value labels and one-line command lists (cli/helptext.py)
            with _usage_as_json(args):
                return super().make_context(*a, **kw)

        def invoke(self, ctx: Any) -> Any:
            with _usage_as_json(args):
                return super().invoke(ctx)

    app = typer.Typer(
        cls=RootGroup,
        name="ddtree-deploy",
        help="Get a DDTree speculative-decoding build of SGLang running on GPU hosts over SSH.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish)
        # -h as well as --help, on every command (click's subcontexts inherit the names)
        context_settings={"help_option_names": helptext.HELP_NAMES},
    )
    only = invoked(args) if args is not None else None
    for name, module, attr, group in COMMANDS:
        if only is not None and name != only:
            continue
        if name == PLUGINS:
            # command groups that other distributions add; never over a built-in's name
            cli_plugins.add_to(app, BUILT_INS)
            continue
        command = getattr(importlib.import_module(f"ddtree_deploy.cli.{module}"), attr)
        if group:
            app.add_typer(command, name=name)
        else:
            app.command(name=name)(command)

    def _version(value: bool) -> None:
        if value:
            from ddtree_deploy.version import version_line

            typer.echo(version_line())
            raise typer.Exit()

    @app.callback()
    def root(
        ctx: typer.Context,
        hosts: str = typer.Option(None, "--hosts", metavar="FILE",
                                  help="hosts file (default: $DDTREE_DEPLOY_HOSTS, ./hosts.yaml, "
                                       "XDG config, the embedded lab file)"),
        lab: bool = typer.Option(False, "--lab",
                                 help="use the embedded lab hosts file on purpose (apply refuses "
                                      "it when it is only the default)"),
        version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                     help="the tool's version and the commit it runs from"),
        debug: bool = typer.Option(False, "--debug",
                                   help="on an error, also the traceback (for a bug report)"),
    ) -> None:
        ctx.obj = {"hosts": hosts, "lab": lab, "debug": debug}

    return app


@contextlib.contextmanager
def _usage_as_json(args: "list[str] | None") -> Iterator[None]:
    """A usage error raised inside: under --json also a JSON document on stdout."""
    from typer._click.exceptions import ClickException

    try:
        yield
    except ClickException as exc:
        if args is not None and _wants_json(args):
            from ddtree_deploy.cli import errdoc

            sys.stdout.write(errdoc.dumps(errdoc.of_usage(exc)))
            sys.stdout.flush()
        raise


def _interrupted_at_start(signum: int, frame: Any) -> None:
    sys.stderr.write("interrupted\n")
    raise SystemExit(130)


def _by_ctrl_c(done: SystemExit) -> bool:
    """Whether typer turned a KeyboardInterrupt into this exit (`raise Exit(130) from` it),
    silently, or into "Aborted." and 1 at a question (confirm's Abort); a command's own exit
    130 (bench's, its results printed) is not."""
    import typer

    seen: BaseException | None = done.__context__
    if isinstance(seen, typer.Abort) and isinstance(seen.__context__, KeyboardInterrupt):
        return True
    while seen is not None:
        if isinstance(seen.__cause__, KeyboardInterrupt):
            return True
        seen = seen.__context__
    return False


def _interrupted(as_json: bool) -> None:
    """Ctrl-C: one line on stderr, and under --json the error document on stdout."""
    try:
        if as_json:
            from ddtree_deploy.cli import errdoc

            sys.stdout.write(errdoc.dumps(errdoc.document("interrupted (Ctrl-C)", 130)))
            sys.stdout.flush()
        sys.stderr.write("interrupted\n")
    except OSError as lost:
        _output_lost(lost)


def _wants_debug(args: list[str]) -> bool:
    return "--debug" in (args[: args.index("--")] if "--" in args else args)


def _wants_json(args: list[str]) -> bool:
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def _stderr(markup: str) -> None:
    from ddtree_deploy.cli.common import console

    console(stderr=True).print(markup, highlight=False, soft_wrap=True)


def _report(exc: Exception, code: int, as_json: bool) -> None:
    from ddtree_deploy.cli.text import esc

    if as_json:
        from ddtree_deploy.cli import errdoc

        sys.stdout.write(errdoc.dumps(errdoc.of_error(exc, code)))
        sys.stdout.flush()
    _stderr(f"[red]error:[/red] {esc(exc)}")


def _output_lost(exc: OSError) -> None:
    """stdout cannot take more: say so on stderr; what is still buffered goes nowhere
    (else the interpreter's last flush prints a traceback of its own)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    if exc.errno != errno.EPIPE:  # the reader left (`| head`): nothing to say, as cat says nothing
        sys.stderr.write(f"error: cannot write the output: {exc.strerror or exc}\n")


def _usable_width() -> None:
    """$COLUMNS and $TERMINAL_WIDTH brought to MIN_WIDTH..MAX_WIDTH (one that is no whole
    number dropped: typer would raise on it), and a terminal narrower than MIN_WIDTH laid out
    at MIN_WIDTH, so that no message or cell is folded away."""
    for name in ("COLUMNS", "TERMINAL_WIDTH"):
        value = os.environ.get(name)
        if value is None:
            continue
        if not value.strip().isascii() or not value.strip().isdigit():
            del os.environ[name]
        else:
            os.environ[name] = str(min(max(int(value), MIN_WIDTH), MAX_WIDTH))
    if "COLUMNS" in os.environ:
        return
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if 0 < os.get_terminal_size(fd).columns < MIN_WIDTH:
                os.environ["COLUMNS"] = str(MIN_WIDTH)
            return


def _standard_streams() -> bool:
    """Make the standard streams safe to use; False when stdout was closed (`>&-`).

    A closed descriptor 0, 1 or 2 gets /dev/null, so that no file the tool opens later takes
    its number (a results file receiving the output), and Python's None stream a real one;
    a stream whose encoding cannot hold a character (PYTHONIOENCODING=ascii and a path in
    UTF-8) writes it as an escape (`\\xe9`) instead of raising."""
    stdout_open = True
    for fd, name, mode in _STREAMS:
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            stream = open(fd, mode, encoding="utf-8", errors="backslashreplace",  # noqa: SIM115
                          closefd=False)  # the process's own stream, for its whole life
            setattr(sys, name, stream)
            stdout_open = stdout_open and fd != 1
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")
    return stdout_open


def main(argv: "list[str] | None" = None) -> None:
    """Console entry point; typer handles usage errors (exit 2) and exits itself."""
    if not _standard_streams():
        sys.stderr.write("error: cannot write the output: standard output is closed (>&-); "
                         "nothing was done (redirect it to /dev/null to discard it)\n")
        sys.exit(1)
    _usable_width()
    args = root_options_first(list(sys.argv[1:] if argv is None else argv))
    # Ctrl-C during the imports: a line and 130, not a traceback; a SIGINT the caller ignored
    # (a background job of a shell without job control) stays ignored, as later in the run
    guard = (threading.current_thread() is threading.main_thread()
             and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)
    if guard:
        previous = signal.signal(signal.SIGINT, _interrupted_at_start)
    from ddtree_deploy.errors import DeployError

    app = build_app(args)
    if guard:
        signal.signal(signal.SIGINT, previous or signal.default_int_handler)
    code = 0
    try:
        try:
            app(args=args, prog_name="ddtree-deploy")
        finally:
            sys.stdout.flush()
    except SystemExit as done:
        if not _by_ctrl_c(done):
            raise
        _interrupted(_wants_json(args))
        code = 130
    except DeployError as exc:
        code = int(exc.exit_code)
        try:
            if _wants_debug(args):
                import traceback

                from ddtree_deploy.cli.text import plain
                from ddtree_deploy.errors import output_of

                # host text in the messages: escaped, as everywhere
                sys.stderr.write(plain("".join(traceback.format_exception(exc))))
                if output := output_of(exc):  # the failed command's stderr, whole (bounded)
                    sys.stderr.write(plain(f"the failed command's stderr:\n{output}\n"))
            _report(exc, code, _wants_json(args))
        except OSError as lost:
            _output_lost(lost)
    except KeyboardInterrupt:
        _interrupted(_wants_json(args))
        code = 130
    except OSError as exc:
        if exc.errno not in _OUTPUT_LOST:
            raise
        _output_lost(exc)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
