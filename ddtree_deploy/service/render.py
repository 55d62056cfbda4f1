"""Render systemd units for an SGLang service or a standalone wrapper command.

Every value that lands in a unit goes through one of the quoting helpers here,
which follow systemd's own rules (systemd.syntax(7), systemd.service(5)
"Command lines", systemd.exec(5) Environment=):

- ExecStart= words: double quotes with C escapes (`\\\\`, `\\"`), `%` -> `%%`
  (specifiers are expanded even inside quotes), `$` -> `$$` (else `$FOO` and
  `${FOO}` expand); a quoted `";"` is a word, not a command separator.
- the executable (ExecStart's first word): `%` -> `%%` but `$` is literal there,
  and systemd refuses quotes and backslashes in it ("Executable name contains
  special characters"), so those are refused here first.
- Environment= assignments: quoted like words, `%` doubled, but `$` has no
  meaning in Environment= and is kept as it is.
Control characters (newlines above all: they would end the line and start a
new directive), the line and paragraph separators Python splits on and systemd
does not (U+0085, U+2028, U+2029) and bidirectional overrides are refused with a
clear message, never escaped (`spec.unit_char_problem`).

What the unit runs is built first as one `UnitCommand` (argv, environment, working
folder; `unit_command`, `wrapper_command`); the unit is written from it and a plain
process (`plainproc.py`) runs that same object, so nothing is parsed back from text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import jinja2

from ddtree_deploy.errors import ExitCode, UsageError
from ddtree_deploy.resources import data_path
from ddtree_deploy.service import endpoint
from ddtree_deploy.service.libpath import ld_library_path
from ddtree_deploy.service.spec import (
    DEPLOYMENT_KEY,
    MANAGED_KEY,
    PORT_KEY,
    ServiceSpec,
    UnitCommand,
)
from ddtree_deploy.settings.values import TOOL_ENVIRONMENT, secret_flag, unit_char_problem

__all__ = ["DEPLOYMENT_KEY", "PORT_KEY", "ld_library_path", "render_unit", "unit_command"]

SGLANG_TEMPLATE = "sglang.service.j2"
WRAPPER_TEMPLATE = "wrapper.service.j2"

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+\Z")  # needs no quotes once % is doubled
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_UNIT_STEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.-]{0,200}\Z")
_EXEC_REFUSED = set("\"'\\")
MAX_EXEC_CHARS = 256 * 1024  # systemd refuses a unit line over 1 MiB (LONG_LINE_MAX); far below
# Names that say "this is a secret": a unit file is world-readable and `systemctl show`
# prints Environment= to any user, so such values belong in a 0600 EnvironmentFile.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|PRIVATE", re.IGNORECASE)

# Order of LD_LIBRARY_PATH after the CUDA toolkit folders (cu13/lib or CUDA 12's per-component
# ones): the libraries that keep their own nvidia/<name>/lib folder in both lanes.


class UnitRenderError(UsageError):
    """A value cannot be placed into a systemd unit (bad character, missing part)."""

    exit_code = ExitCode.USAGE


def _check_text(value: str, what: str) -> str:
    if not isinstance(value, str):
        raise UnitRenderError(f"{what} must be text, got {type(value).__name__}")
    problem = unit_char_problem(value)
    if problem:
        raise UnitRenderError(
            f"{what} {value!r} {problem}; a systemd unit cannot carry it",
            hint="newlines, tabs, other control characters and line separators are not "
                 "allowed in unit values",
        )
    return value


def _quote_if_needed(text: str) -> str:
    if _SAFE_WORD.match(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def systemd_quote(arg: str, *, what: str = "argument") -> str:
    """One ExecStart= word (an argument after the executable), quoted for systemd."""
    _check_text(arg, what)
    if not arg:
        raise UnitRenderError(f"an empty {what} cannot be placed in ExecStart=",
                              hint="remove the empty value (an empty extra_args entry?)")
    return _quote_if_needed(arg.replace("%", "%%").replace("$", "$$"))


def systemd_quote_executable(path: str, *, what: str = "executable") -> str:
    """ExecStart='s first word: an absolute path; `%` doubled, `$` literal."""
    _check_text(path, what)
    if not path.startswith("/"):
        raise UnitRenderError(f"{what} {path!r} must be an absolute path")
    refused = sorted(_EXEC_REFUSED.intersection(path))
    if refused:
        raise UnitRenderError(
            f"{what} {path!r} contains {' '.join(refused)}, which systemd refuses in "
            "an executable path",
            hint="move the venv to a path without quotes or backslashes",
        )
    if "$" in path:
        # systemd expands $NAME in the process's argv[0] but not in the path it runs, and
        # Python finds its venv from argv[0]: under systemd another python's packages.
        raise UnitRenderError(
            f"{what} {path!r} contains $, which systemd would expand in the program's "
            "argv[0] (Python finds its venv from it) but not in the path it runs",
            hint="move the venv to a path without $",
        )
    return _quote_if_needed(path.replace("%", "%%"))


def systemd_env(name: str, value: str) -> str:
    """One Environment= assignment, quoted for systemd (`$` is not special there)."""
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        raise UnitRenderError(f"invalid environment variable name {name!r}")
    if _SECRET_NAME.search(name):
        raise UnitRenderError(
            f"environment variable {name} looks like a secret; units are world-readable",
            hint="put secrets in an EnvironmentFile= with mode 0600 (or LoadCredential=)",
        )
    _check_text(value, f"value of {name}")
    return _quote_if_needed(f"{name}={value}".replace("%", "%%"))


def _plain(value: str, what: str) -> str:
    """A value placed as is (Description=, comments, X- keys): % doubled where expanded."""
    return _check_text(value, what).replace("%", "%%")


def _unit_stem(name: str) -> str:
    if not isinstance(name, str) or not _UNIT_STEM.match(name):
        raise UnitRenderError(
            f"unit name {name!r} is not valid",
            hint="use letters, digits, ':', '_', '.' and '-' (starting with a letter or digit)",
        )
    return name


def _gpus(gpus: Iterable[int], what: str) -> str:
    gpu_list = list(gpus)
    if not gpu_list:
        raise UnitRenderError(
            f"{what}: no GPU chosen; an empty CUDA_VISIBLE_DEVICES would expose every GPU",
        )
    if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpu_list):
        raise UnitRenderError(f"{what}: GPU indices must be non-negative integers: {gpu_list}")
    if len(set(gpu_list)) != len(gpu_list):
        raise UnitRenderError(f"{what}: a GPU is listed twice: {gpu_list}")
    return ",".join(str(g) for g in gpu_list)


def _port(port: int | None, what: str) -> int | None:
    if port is not None and (isinstance(port, bool) or not 1 <= port <= 65535):
        raise UnitRenderError(f"{what}: port {port!r} is not in 1..65535")
    return port


def _ld_value(dirs: Iterable[str]) -> str:
    for d in dirs:
        _check_text(d, "library folder")
        if not d.startswith("/") or ":" in d:
            raise UnitRenderError(f"library folder {d!r} must be an absolute path without ':'")
    return ":".join(dirs)


def _exec_lines(executable: str, args: list[str]) -> list[str]:
    """ExecStart as lines: the program and -m on the first, then one flag (+ value) per line."""
    words = [systemd_quote_executable(executable)]
    i = 0
    while i < len(args) and not args[i].startswith("--"):
        words.append(systemd_quote(args[i]))
        i += 1
    lines = [" ".join(words)]
    while i < len(args):
        group = [args[i]]
        i += 1
        while i < len(args) and not args[i].startswith("--"):
            group.append(args[i])
            i += 1
        lines.append(" ".join(systemd_quote(a) for a in group))
    return lines


def _header(tool_version: str, what: str, host: str) -> str:
    version = _check_text(tool_version, "tool version")
    return (
        f"# Rendered by ddtree-deploy {version} for {_check_text(what, 'deployment')} "
        f"on {_check_text(host, 'host')}; do not edit: re-render with ddtree-deploy service up"
    )


def _environment(gpus: str, ld_dirs: Iterable[str], extra: Mapping[str, str],
                 own: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """The unit's environment, every name and value checked: the tool's own (GPUs, library
    path, `own`: the DDTree plugin's settings), then `extra` (a deployment's `environment:`,
    none of the tool's)."""
    env: dict[str, str] = {
        # nvidia-smi numbers GPUs by PCI bus; CUDA's default order is "fastest first".
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": gpus,
    }
    ld = _ld_value(tuple(ld_dirs))
    if ld:
        env["LD_LIBRARY_PATH"] = ld
    env["PYTHONUNBUFFERED"] = "1"
    env.update(own)
    for name in sorted(extra):
        if name in env or name in TOOL_ENVIRONMENT:
            raise UnitRenderError(
                f"environment variable {name} is set by the tool itself"
                + (f" (from {TOOL_ENVIRONMENT[name]})" if name in TOOL_ENVIRONMENT else ""))
        env[name] = extra[name]
    for name, value in env.items():
        systemd_env(name, value)
    return env


def _environment_loader() -> jinja2.Environment:
    try:
        folder = data_path("templates")
    except FileNotFoundError as exc:
        raise UnitRenderError(str(exc)) from None
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _render(template: str, **values: object) -> str:
    try:
        return _environment_loader().get_template(template).render(**values)
    except jinja2.TemplateNotFound:
        raise UnitRenderError(f"unit template {template} is missing from templates/") from None
    except jinja2.TemplateError as exc:
        raise UnitRenderError(f"unit template {template} failed: {exc}") from None


def _check_secret_flags(args: Iterable[str]) -> None:
    for arg in args:
        flag = secret_flag(arg)
        if flag is not None:
            option = arg.split("=", 1)[0]
            named = flag if option == flag else f"{option} (SGLang's argparse reads it as {flag})"
            raise UnitRenderError(
                f"{named} would put a secret into a world-readable unit",
                hint="pass keys through an EnvironmentFile= with mode 0600 instead",
            )


def unit_command(spec: ServiceSpec) -> UnitCommand:
    """What the unit of `spec` runs, checked: the argv, environment and folder of both modes."""
    name = _unit_stem(spec.name)
    what = f"service {name}"
    gpus = _gpus(spec.gpus, what)
    if spec.tp_size != len(spec.gpus):
        raise UnitRenderError(
            f"{what}: tp size {spec.tp_size} needs {spec.tp_size} GPU(s), got {list(spec.gpus)}"
        )
    if spec.algorithm != "none" and not spec.draft_model_path:
        raise UnitRenderError(f"{what}: algorithm {spec.algorithm} needs a draft model path")
    named = [("model path (model_path, --model-path)", spec.model_path),
             ("draft model path (draft_model_path, --draft-model-path)", spec.draft_model_path)]
    named += [(f"extra_args[{i}]", a) for i, a in enumerate(spec.extra_args)]
    for what_field, value in named:
        if value is not None:
            _check_text(value, what_field)  # the field named before the argv is checked
    server = spec.command()  # settings.command: argv and environment per SGLang version
    args = list(server.args)
    _check_secret_flags(args)
    cwd = _workdir(spec.venv, "venv")
    systemd_quote_executable(spec.python, what="venv python")
    for arg in args:
        systemd_quote(arg)
    env = _environment(gpus, spec.ld_library_path, dict(server.env), server.plugin_env)
    stem = name
    run: tuple[str, ...] = (spec.python, "-m", "sglang.launch_server")
    if "api_key" in spec.secrets:  # the key in a 0600 file; the launcher hides it in the log
        run = (spec.python, endpoint.launcher(stem))
        args = [*args, "--config", endpoint.config_file(stem)]
    if spec.user is not None:
        _check_text(spec.user, "user")
    argv = (*run, *args)
    if sum(len(a) + 3 for a in argv) > MAX_EXEC_CHARS:
        raise UnitRenderError(f"{what}: the command line is longer than {MAX_EXEC_CHARS} "
                              "characters; systemd would not read a unit line that long",
                              hint="shorten extra_args or the paths")
    return UnitCommand(argv=argv, env=env, cwd=cwd,
                       env_file=endpoint.env_file(stem) if "hf_token" in spec.secrets else None,
                       user=spec.user)


def render_unit(spec: ServiceSpec, *, tool_version: str) -> str:
    """The systemd unit text of one SGLang service (written from `unit_command(spec)`)."""
    command = unit_command(spec)
    name = spec.name
    what = f"service {name}"
    deployment = spec.deployment
    return _render(
        SGLANG_TEMPLATE,
        header=_header(tool_version, f"deployment {deployment}" if deployment else what, spec.host),
        description=_plain(
            f"SGLang {spec.algorithm} server {name} on port {spec.port}", "description"
        ),
        managed_key=MANAGED_KEY,
        deployment_key=DEPLOYMENT_KEY,
        deployment=_check_text(deployment, "deployment") if deployment else None,
        port_key=PORT_KEY,
        port=_port(spec.port, what),
        workdir=_plain(command.cwd, "venv"),
        environment=[systemd_env(k, v) for k, v in command.env.items()],
        exec_lines=_exec_lines(command.argv[0], list(command.argv[1:])),
        syslog_identifier=name,
        user=command.user,
        environment_file=command.env_file,
    )


def _absolute(path: str, what: str) -> str:
    _check_text(path, what)
    if not path.startswith("/"):
        raise UnitRenderError(f"{what} {path!r} must be an absolute path")
    return path.rstrip("/") or "/"


def _workdir(path: str, what: str) -> str:
    """WorkingDirectory='s value: systemd takes it unquoted and simplified, so it must be one
    path both read alike (no space at either end: systemd strips it; no `..`: it refuses it)."""
    path = _absolute(path, what)
    if path != path.strip(" "):
        raise UnitRenderError(
            f"{what} {path!r} begins or ends with a space, which systemd strips from "
            "WorkingDirectory= (it cannot be quoted there)",
            hint="use a folder whose path does not begin or end with a space",
        )
    parts = path.split("/")
    if ".." in parts:
        raise UnitRenderError(f"{what} {path!r} contains '..', which systemd refuses in "
                              "WorkingDirectory=", hint="give the path without '..'")
    return "/" + "/".join(p for p in parts if p not in ("", "."))


@dataclass(frozen=True)
class WrapperSpec:
    """A standalone unit running one command (e.g. a script serving a model on one GPU)."""

    name: str  # unit stem
    command: tuple[str, ...]  # argv; the first is an absolute path
    gpus: tuple[int, ...]
    port: int | None = None  # the port it serves, for the description and X- key
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "localhost"
    workdir: str = "/"
    description: str | None = None


def wrapper_command(spec: WrapperSpec) -> UnitCommand:
    """What the unit of a wrapper runs, checked (see `unit_command`)."""
    what = f"wrapper {_unit_stem(spec.name)}"
    if not spec.command:
        raise UnitRenderError(f"{what}: the command is empty")
    command = tuple(_check_text(a, "command argument") for a in spec.command)
    _check_secret_flags(command)
    systemd_quote_executable(command[0])
    env = _environment(_gpus(spec.gpus, what), (), spec.env)
    return UnitCommand(argv=command, env=env, cwd=_workdir(spec.workdir, "working directory"))


def render_wrapper(spec: WrapperSpec, tool_version: str) -> str:
    """The systemd unit text of a wrapper command, with the service's safety settings."""
    command = wrapper_command(spec)
    name = spec.name
    what = f"wrapper {name}"
    port = _port(spec.port, what)
    gpus = command.env["CUDA_VISIBLE_DEVICES"]
    default = f"ddtree-deploy wrapper {name} on GPU {gpus}" + (
        f", port {port}" if port is not None else ""
    )
    return _render(
        WRAPPER_TEMPLATE,
        header=_header(tool_version, what, spec.host),
        description=_plain(spec.description or default, "description"),
        managed_key=MANAGED_KEY,
        port_key=PORT_KEY,
        port=port,
        workdir=_plain(command.cwd, "working directory"),
        environment=[systemd_env(k, v) for k, v in command.env.items()],
        exec_lines=_exec_lines(command.argv[0], list(command.argv[1:])),
        syslog_identifier=name,
    )
