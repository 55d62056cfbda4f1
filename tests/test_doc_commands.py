"""Every `ddtree-deploy ...` command line the docs show, and every hint the code prints, is one
the CLI accepts (issue 30's "remedies that run", extended from the remedies to all of them).

The docs: README.md, docs/*.md, the example and embedded hosts files, lab/README.md; each
command in backquotes or on a line of a code block. An example (`plan ct200 --out plan.json`)
is parsed whole by the CLI's own parser (tests/test_remedies.py's `parse`: nothing run); a
synopsis (`doctor HOST [--venv PATH] [--json]`, `payload deploy | verify`, `lab up ... / down`)
has each command of it resolved and each option it names checked to exist on that command.
The code: every string literal of ddtree_deploy/ and lab/ddtree_lab/ that names a command
in backquotes or in a parenthesis, its `{...}` fields filled with a word, parsed the same way.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main
from test_remedies import parse
from typer._click.exceptions import ClickException
from typer.core import TyperGroup

from ddtree_deploy.cli.app import build_app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "examples" / "hosts.story.yaml", ROOT / "hosts.yaml", ROOT / "lab" / "README.md"]
# What a reader types for a placeholder that must be a number
NUMBERS = {"N": "1", "P": "30002", "S": "60"}
SYNOPSIS = re.compile(r"\[|\.\.\.|…| / | \| [a-z]|\bCOMMAND\b")
# where a shell line goes on past the command: a pipe into a tool, `;`, `&&`, `$(...)`'s end
SHELL_END = re.compile(r" \| (?=(?:grep|jq|head|tail|less|sort|tee|wc|awk|sed)\b)| \|\| | && "
                       r"|; |\)(?:;|$)")


def _commands_in(text: str) -> list[str]:
    found = [m.group(1) for m in re.finditer(r"`([^`\n]*?ddtree-deploy [^`\n]*)`", text)]
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        found += [line for line in block.splitlines() if "ddtree-deploy " in line]
    out = []
    for line in found:
        command = line[line.index("ddtree-deploy"):].replace("\\|", "|")
        if not re.match(r"ddtree-deploy (-|[a-z])", command):
            continue  # prose: "ddtree-deploy wrapper ...", "ddtree-deploy data"
        out.append(SHELL_END.split(command)[0].strip())
    return out


def doc_commands() -> list[tuple[str, str]]:
    return [(path.relative_to(ROOT).as_posix(), command)
            for path in DOCS for command in _commands_in(path.read_text(encoding="utf-8"))]


FIELD = "\x00"  # an f-string's field, filled with a host's name once the command is found


def code_hints() -> list[tuple[str, str]]:
    """Command lines in the code's string literals (f-strings' fields filled with a word)."""
    found = []
    # the tool's hints in backquotes, parentheses or after a colon; the lab's in backquotes
    # (it names itself in prose: "(ddtree-deploy lab stand-in)", "Generator: ddtree-deploy")
    anywhere = rf"(?:[`(]|: )\s*(ddtree-deploy (?:-|[a-z{FIELD}])[^`)]*)(?:[`)]|$)"
    quoted = rf"`(ddtree-deploy (?:-|[a-z{FIELD}])[^`]*)`"
    for path in sorted([*(ROOT / "ddtree_deploy").rglob("*.py"),
                        *(ROOT / "lab" / "ddtree_lab").rglob("*.py")]):
        if "remote" in path.parts:
            continue  # host-side code: no CLI
        pattern = quoted if "lab" in path.relative_to(ROOT).parts[:1] else anywhere
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else FIELD
                               for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            for m in re.finditer(pattern, text):
                command = m.group(1).strip()
                if command.split()[1] == FIELD:
                    continue  # `ddtree-deploy {name}`: a plugin's group named in a message
                found.append((path.relative_to(ROOT).as_posix(),
                              command.replace(FIELD, "ct200")))
    return found


def _resolve(words: list[str]) -> tuple[Any, list[str]]:
    """The click command the words reach (bench HOST: bench run), and its path; an option's
    value on the way (`overlay --abi LANE`) is not taken for a command."""
    cmd = typer.main.get_command(build_app(None))
    path: list[str] = []
    rest = list(words)
    while isinstance(cmd, TyperGroup) and rest:
        word = rest.pop(0)
        if word.startswith("-"):
            option = next((p for p in cmd.params if word in p.opts), None)
            if option is not None and not getattr(option, "is_flag", False) and rest:
                rest.pop(0)
            continue
        sub = cmd.commands.get(word)
        if sub is None:
            if path == ["bench"]:
                sub, word = cmd.commands["run"], "run"
            elif cmd.invoke_without_command:
                break  # the group runs itself (overlay --abi ...): the rest are its arguments
            else:
                raise AssertionError(f"no command {' '.join([*path, word])}")
        cmd = sub
        path.append(word)
    return cmd, path


def _options(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


def check_synopsis(command: str) -> None:
    """Each command of a synopsis exists and has every option the synopsis names."""
    root = typer.main.get_command(build_app(None))
    segments = command.split(" / ")
    words = shlex.split(segments[0].replace("[", " ").replace("]", " "))[1:]
    words = [w for w in words if w != "COMMAND"]
    first, path = _resolve(words)
    variants = [(first, path, segments[0])]
    for segment in segments[1:]:  # `lab up [...] / down [--purge] / status`: siblings
        sibling = segment.split()[0]
        cmd, sub = _resolve([*path[:-1], sibling])
        variants.append((cmd, sub, segment))
    for alt in re.findall(r" \| ([a-z]+)", segments[0]):  # `payload deploy | verify`
        variants.append((*_resolve([*path[:-1], alt]), ""))
    for cmd, sub, text in variants:
        known = _options(cmd) | _options(root)
        for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", text):
            assert option in known, f"{' '.join(sub)} has no {option}"


def check(command: str) -> None:
    if SYNOPSIS.search(command):
        check_synopsis(command)
        return
    words = [NUMBERS.get(w, w) for w in shlex.split(command)]
    parse(shlex.join(words))


def _ids(cases: list[tuple[str, str]]) -> list[str]:
    return [f"{where}:{command}"[:90] for where, command in cases]


DOC_CASES = doc_commands()
CODE_CASES = code_hints()


def test_the_docs_and_the_code_show_commands() -> None:
    assert len(DOC_CASES) > 100 and len(CODE_CASES) > 10
    assert any(c == "ddtree-deploy apply --plan plan.json --yes" for _, c in DOC_CASES)


@pytest.mark.parametrize(("where", "command"), DOC_CASES, ids=_ids(DOC_CASES))
def test_every_command_the_docs_show_parses(where: str, command: str) -> None:
    if re.fullmatch(r"ddtree-deploy( [a-z]+)+", command) and len(command.split()) <= 3:
        _resolve(command.split()[1:])  # a command's name ("`ddtree-deploy service up`")
        return
    try:
        check(command)
    except ClickException as exc:
        raise AssertionError(f"{where}: {command}: {exc.format_message()}") from None


@pytest.mark.parametrize(("where", "command"), CODE_CASES, ids=_ids(CODE_CASES))
def test_every_command_a_hint_names_parses(where: str, command: str) -> None:
    if re.fullmatch(r"ddtree-deploy( [a-z]+)+", command) and len(command.split()) <= 3:
        _resolve(command.split()[1:])
        return
    try:
        check(command)
    except ClickException as exc:
        raise AssertionError(f"{where}: {command}: {exc.format_message()}") from None


@pytest.mark.parametrize("bad", [
    "ddtree-deploy plan --out",  # an option without its value
    "ddtree-deploy doctor HOST [--deployments NAME]",  # no such option in a synopsis
    "ddtree-deploy payload deploy | verfy",  # no such sibling
    "ddtree-deploy lab up [--wait S] / down [--purge] / stat",
])
def test_the_checks_refuse_a_wrong_command(bad: str) -> None:
    with pytest.raises((ClickException, AssertionError)):
        check(bad)
