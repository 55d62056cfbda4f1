"""Help that reads the same on every command: labels for values, one line per command.

Run once per invocation on the click command tree typer built (cli/app.py's root group):

- a value's label says what to type (``N``, ``NUM``, ``TEXT``, ``PATH``, the choices), never
  typer's Python type (``<int>``, ``<list[str]>``); a flag has none (it takes no value);
- an argument is named in capitals, as usage lines elsewhere name them (``HOST [NAME]``,
  ``[HOSTS]...``), with no type beside it (typer's ``{HOST}`` and ``<str>``);
- a comma-separated default is shown with spaces after its commas, so a narrow terminal
  wraps it instead of cutting it with "…";
- a command's line in its group's list is its docstring's first sentence on one line (the
  docstring's own line breaks do not leak into the list), whole: never cut with "…";
- every option's names are shown whole at any width (cli/helptable.py).
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

_BY_TYPE = {"int": "N", "float": "NUM", "Path": "PATH", "str": "TEXT", "bool": "BOOL"}
_SENTENCE = re.compile(r"(?<=[.;!?])\s")
SHORT_MAX = 90


def _label(param: Any) -> str | None:
    """None: typer's own label is kept (choices, and types this table does not know)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is None or desc.is_choice or not hasattr(param, "bare_type"):
        return None
    kind = param.bare_type()
    if kind.startswith("list[") and kind.endswith("]"):
        kind = kind[5:-1]
    return _BY_TYPE.get(kind)


JSON_HELP = ("print one JSON document for machines, a failure too: {ok, results | error, "
             "exit_code, schema} (docs/json.md)")
# What a parameter of this name means wherever it appears without help of its own.
COMMON_HELP = {
    "as_json": JSON_HELP,
    "json": JSON_HELP,
    "host": "a host of the hosts file",
    "name": "a deployment of the hosts file, or a unit name",
}


# Labels better than the type's, by option (a path on the host is typed as text).
LABELS = {
    "--venv": "PATH", "--from-venv": "PATH", "--model-path": "PATH", "--draft-model-path": "PATH",
    "--log-file": "PATH", "--out": "FILE", "--abi": "LANE", "--to": "HOST[:VENV]",
    "--from": "HOST", "--deployment": "NAME", "--name": "NAME", "--workload": "NAME",
    "--installer": "uv|pip|auto",
}
# Help that starts with the choices ("none | dflash | ddtree"): they are the label.
_CHOICES_IN_HELP = re.compile(r"([\w.-]+(?: \| [\w.-]+)+)(?:\s|$)")
# Options that take a comma-separated list in one value (bench's grid flags).
LISTS = {"--configs": "CONFIG,...", "--concurrency": "N,...", "--sampling": "MODE,...",
         "--workloads": "NAME,..."}


def _argument(param: Any) -> None:
    """HOST, [NAME] and [HOSTS]... in the usage line; the name alone in the arguments panel
    (a metavar given by the command is kept as the name)."""
    more = "..." if param.nargs != 1 else ""
    name = (param.metavar or (param.name or "value").upper()).removesuffix("...")
    param.metavar = name + more
    usage = (name if param.required else f"[{name}]") + more
    param._usage_display_name = lambda: usage  # typer: {NAME} for a required one
    param.display_type_rich = lambda ctx: None  # typer: <str>, <list[str]>


def _spaced_default(param: Any) -> None:
    default = param.default
    if isinstance(default, str) and "," in default and " " not in default:
        shown = ", ".join(default.split(","))
        param._get_default_string = lambda **_: shown


def label_params(command: Any) -> None:
    for param in getattr(command, "params", ()):
        if not getattr(param, "help", None) and param.name in COMMON_HELP:
            param.help = COMMON_HELP[param.name]
        if param.param_type_name == "argument":
            _argument(param)
            continue
        _spaced_default(param)
        if param.metavar is not None:
            continue
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""
            continue
        opt = next((o for o in param.opts if o.startswith("--")), "")
        choices = _CHOICES_IN_HELP.match(param.help or "")
        label = LABELS.get(opt) or (choices and choices.group(1).replace(" | ", "|")) \
            or _label(param)
        if isinstance(param.default, str) and "," in param.default:
            label = LISTS.get(opt, "TEXT,...")
        if label is not None:
            param.metavar = label + ("..." if param.nargs != 1 else "")


def short_help(text: str) -> str:
    """The first paragraph on one line; past SHORT_MAX, its first sentence (whole)."""
    first = " ".join(text.strip().split("\n\n", 1)[0].split())
    if len(first) <= SHORT_MAX:
        return first
    parts = _SENTENCE.split(first, maxsplit=1)
    return parts[0].rstrip(";") if parts else first


HELP_NAMES = ["-h", "--help"]

# An example for each built-in command, shown under its help (the hosts and deployments are
# those of examples/hosts.story.yaml and the lab's hosts.yaml).
EXAMPLES: dict[str, str] = {
    "": "ddtree-deploy --hosts hosts.yaml plan",
    "plan": "ddtree-deploy plan ct200 --out plan.json",
    "apply": "ddtree-deploy apply --plan plan.json --yes -v",
    "inventory": "ddtree-deploy inventory ct129 ct200 | grep -v '^#'",
    "doctor": "ddtree-deploy doctor ct200 --deployment sglang-ddtree",
    "probe": "ddtree-deploy probe ct200 sglang-ddtree --deadline 600",
    "service": "ddtree-deploy service status ct200",
    "service render": "ddtree-deploy service render ct200 sglang-ddtree",
    "service up": "ddtree-deploy service up ct200 sglang-ddtree --ddtree-budget 31",
    "service down": "ddtree-deploy service down ct200 sglang-ddtree",
    "service status": "ddtree-deploy service status ct200 sglang-ddtree --json",
    "service logs": "ddtree-deploy service logs ct200 sglang-ddtree -n 50",
    "service list": "ddtree-deploy service list ct200",
    "payload": "ddtree-deploy payload status ct200",
    "payload deploy": "ddtree-deploy payload deploy ct200 --venv /root/venv_sglang211",
    "payload verify": "ddtree-deploy payload verify ct200 --venv /root/venv_sglang211",
    "payload rollback": "ddtree-deploy payload rollback ct200 --venv /root/venv_sglang211",
    "payload status": "ddtree-deploy payload status ct200 --json",
    "venv": "ddtree-deploy venv clone ct200 /root/venv /root/venv_sglang211",
    "venv clone": "ddtree-deploy venv clone ct200 /root/venv /root/venv_sglang211",
    "overlay": "ddtree-deploy overlay --abi cu130 --to ct200:/root/venv_sglang211 --dry-run",
    "overlay rollback": "ddtree-deploy overlay rollback ct200 --venv /root/venv_sglang211",
    "overlay history": "ddtree-deploy overlay history ct200 --json",
    "hosts": "ddtree-deploy hosts check",
    "hosts list": "ddtree-deploy hosts list --wide",
    "hosts check": "ddtree-deploy hosts check ct129 ct200",
    "hosts trust": "ddtree-deploy hosts trust ct200",
    "hosts disconnect": "ddtree-deploy hosts disconnect ct200",
    "bench": "ddtree-deploy bench ct200 sglang-ddtree --configs dflash,ddtree:15/8",
    "bench run": "ddtree-deploy bench run ct200 sglang-ddtree --requests 8 --dry-run",
    "bench report": "ddtree-deploy bench report ct200 sglang-ddtree",
    "bench recommend": "ddtree-deploy bench recommend ct200 sglang-ddtree --write sglang-ddtree",
}


EXAMPLE = "Example:\n\n  "  # the command on a line of its own: copied whole, never wrapped
EXAMPLE_MAX = 76  # an 80-column terminal shows it on one line


def example_of(command: Any) -> str | None:
    """The example a command's help shows (a plugin gives its own epilog the same way)."""
    epilog = getattr(command, "epilog", None) or ""
    return epilog.removeprefix(EXAMPLE).strip() if epilog.startswith(EXAMPLE) else None


def _names_whole(command: Any) -> None:
    """The command's help page draws its options with every name whole (cli/helptable.py)."""
    format_help = command.format_help
    if getattr(format_help, "names_whole", False):
        return

    def whole(ctx: Any, formatter: Any) -> None:
        from ddtree_deploy.cli.helptable import whole_names

        with whole_names():
            format_help(ctx, formatter)

    whole.names_whole = True  # type: ignore[attr-defined]
    command.format_help = whole


def prepare(command: Any, path: str = "") -> None:
    """Labels, examples, command lines and whole option names for `command` and everything
    below it."""
    label_params(command)
    _names_whole(command)
    if path in EXAMPLES and not command.epilog:
        command.epilog = EXAMPLE + EXAMPLES[path]
    get_help = getattr(command, "get_help_option", None)
    if get_help is not None:  # made once per command and kept: a flag, no label either
        help_option = get_help(SimpleNamespace(help_option_names=HELP_NAMES))
        if help_option is not None:
            help_option.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = short_help(sub.help)
        prepare(sub, f"{path} {sub.name}".strip())
