"""SGLang's command-line flags, read from the installed REAL ``server_args.py``.

The stand-in launcher must accept exactly the flags the installed sglang accepts
(the DDTree payload adds ``--speculative-ddtree-*`` flags and a ``DDTREE`` choice
later), and refuse the rest the way real argparse does. So the parser is built
from the source text of ``sglang/srt/server_args.py``: every
``add_argument(...)`` call (option strings, action, type, choices, nargs,
required, dest) and the literal defaults of the ``ServerArgs`` dataclass. The
real module itself cannot be imported here (it imports torch and more).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from typing import Any

from ddtree_lab_standin.realfields import add_fields

_TYPES: dict[str, Any] = {"int": int, "float": float}
_NOT_LITERAL = object()


def _literal(node: ast.AST | None, names: dict[str, Any]) -> Any:
    if node is None:
        return _NOT_LITERAL
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return names.get(f"{node.value.id}.{node.attr}", _NOT_LITERAL)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level literal constants and ``ServerArgs`` field defaults."""
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                value = _literal(node.value, names)
                if value is not _NOT_LITERAL:
                    names[target.id] = value
        elif isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and item.value is not None
                ):
                    value = _literal(item.value, names)
                    if value is not _NOT_LITERAL:
                        names[f"ServerArgs.{item.target.id}"] = value
    return names


def _add(parser: argparse.ArgumentParser, call: ast.Call, names: dict[str, Any]) -> None:
    flags: list[str] = [
        a.value for a in call.args
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
    ]
    if not flags:
        return
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    opts: dict[str, Any] = {}
    action_node = kw.get("action")
    action_src = ast.unparse(action_node) if action_node is not None else ""
    action = _literal(action_node, names)
    if action in ("store_true", "store_false"):
        opts["action"] = action
    elif "BooleanOptional" in action_src:
        opts["action"] = argparse.BooleanOptionalAction
    elif "StoreTrue" in action_src:
        opts["action"] = "store_true"
    else:
        type_node = kw.get("type")
        if isinstance(type_node, ast.Name) and type_node.id in _TYPES:
            opts["type"] = _TYPES[type_node.id]
        nargs = _literal(kw.get("nargs"), names)
        if nargs is not _NOT_LITERAL:
            opts["nargs"] = nargs
        elif action_node is not None:  # a custom action (deprecated flags, LoRA paths)
            opts["nargs"] = "*"
        choices = _literal(kw.get("choices"), names)
        if isinstance(choices, (list, tuple)) and choices:
            opts["choices"] = list(choices)
    for key in ("required", "dest"):
        value = _literal(kw.get(key), names)
        if value is not _NOT_LITERAL:
            opts[key] = value
    default = _literal(kw.get("default"), names)
    if default is not _NOT_LITERAL and opts.get("action") not in ("store_true", "store_false"):
        opts["default"] = default
    try:
        parser.add_argument(*flags, **opts)
    except (argparse.ArgumentError, ValueError, TypeError):
        return  # a duplicate or an exotic definition: leave it out


def parser_prog(text: str) -> str:
    match = re.search(r"ArgumentParser\(\s*prog\s*=\s*\"([^\"]+)\"", text)
    return match.group(1) if match else "sglang serve"


def _flag_modules(tree: ast.Module, server_args_file: Path) -> list[Path]:
    """Files of sglang modules whose imported helper server_args.py calls with the parser.

    Real SGLang (and the DDTree payload) may define flags in a helper module, e.g.
    ``from sglang.srt.x import add_x_args`` then ``add_x_args(parser)``.
    """
    srt = server_args_file.parent  # .../sglang/srt
    imported: dict[str, Path] = {}
    for node in ast.walk(tree):
        module = node.module or "" if isinstance(node, ast.ImportFrom) else ""
        if isinstance(node, ast.ImportFrom) and module.startswith("sglang.srt."):
            rel = Path(*module.split(".")[2:]).with_suffix(".py")
            for alias in node.names:
                imported[alias.asname or alias.name] = srt / rel
    files = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in imported
                and any(isinstance(a, ast.Name) and a.id == "parser" for a in node.args)
                and imported[node.func.id].is_file()):
            files.append(imported[node.func.id])
    return list(dict.fromkeys(files))


def _add_all(parser: argparse.ArgumentParser, tree: ast.Module, names: dict[str, Any]) -> None:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            _add(parser, node, names)


def build_parser(server_args_file: Path) -> argparse.ArgumentParser:
    """An argparse parser with every flag the installed server_args.py defines."""
    text = server_args_file.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(server_args_file))
    names = _module_constants(tree)
    parser = argparse.ArgumentParser(prog=parser_prog(text))
    _add_all(parser, tree, names)
    add_fields(parser, tree, names, _literal, _NOT_LITERAL)  # 0.5.17+: A[...] fields
    for extra in _flag_modules(tree, server_args_file):
        sub = ast.parse(extra.read_text(encoding="utf-8"), filename=str(extra))
        _add_all(parser, sub, {**names, **_module_constants(sub)})
    return parser


def defines_flag(server_args_file: Path, flag: str) -> bool:
    """Whether the installed server_args.py (or a flag helper it calls) defines this flag."""
    try:
        text = server_args_file.read_text(encoding="utf-8")
        tree = ast.parse(text)
        texts = [text] + [p.read_text(encoding="utf-8")
                          for p in _flag_modules(tree, server_args_file)]
    except (OSError, SyntaxError):
        return False
    return any(f'"{flag}"' in t or f"'{flag}'" in t for t in texts)
