"""SGLang 0.5.17+'s flags, read from the ``ServerArgs`` fields of the REAL ``server_args.py``.

From 0.5.17 most flags are no longer ``parser.add_argument`` calls: each is a field declared
``name: A[TYPE, "help" | Arg(...), NS(...)] = DEFAULT`` and registered by
``arg_groups/arg_utils.add_cli_args_from_dataclass``, which names the flag ``--name-with-dashes``
(or ``Arg(cli_name=...)``, plus ``aliases``), skips ``Arg(no_cli=True)``, makes a ``bool`` a
store-true flag, takes ``choices`` from ``Arg`` or a ``Literal``, and ``nargs`` for lists. The
lab cannot import server_args.py (it imports torch and most of SGLang), so the same mapping is
read from its source here, with ast.
"""

from __future__ import annotations

import argparse
import ast
from typing import Any

_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str}


def _unwrap(node: ast.expr) -> tuple[str, ast.expr | None]:
    """(kind, Literal slice): kind is bool/int/float/str/list/other, Optional removed."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        if node.value.id == "Optional":
            return _unwrap(node.slice)
        if node.value.id in ("List", "list", "Tuple", "tuple"):
            return "list", None
        if node.value.id == "Literal":
            return "literal", node.slice
    if isinstance(node, ast.Name):
        return (node.id if node.id in ("bool", *_TYPES) else "other"), None
    return "other", None


def _kw(call: ast.Call, names: dict[str, Any], literal: Any, missing: object) -> dict[str, Any]:
    out = {}
    for k in call.keywords:
        if k.arg:
            value = literal(k.value, names)
            out[k.arg] = None if value is missing else value
    return out


def add_fields(parser: argparse.ArgumentParser, tree: ast.Module, names: dict[str, Any],
               literal: Any, missing: object) -> None:
    """Every ``A[...]`` field of ``class ServerArgs`` that add_cli_args_from_dataclass would
    register (`literal`/`missing`: realargs' literal reader and its not-a-literal marker)."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"),
               None)
    if cls is None:
        return
    for item in cls.body:
        if not isinstance(item, ast.AnnAssign):
            continue
        ann = item.annotation
        if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name)
                and ann.value.id == "A" and isinstance(ann.slice, ast.Tuple)
                and len(ann.slice.elts) >= 2 and isinstance(item.target, ast.Name)):
            continue
        field = item.target.id
        type_node, meta = ann.slice.elts[0], ann.slice.elts[1]
        if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
            kw = _kw(meta, names, literal, missing)
        elif isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            kw = {}
        else:
            continue  # no Arg and no help text: registered by hand, if at all
        if kw.get("no_cli"):
            continue
        flag = kw.get("cli_name") or "--" + field.replace("_", "-")
        flags = [flag] + [a for a in (kw.get("aliases") or []) if isinstance(a, str)]
        kind, lit = _unwrap(type_node)
        default = literal(item.value, names) if item.value is not None else None
        opts: dict[str, Any] = {"dest": field}
        if default is not missing:
            opts["default"] = default
        if "action" in kw:  # a custom action (deprecated flags and the like): takes a value
            opts["nargs"] = "?"
        elif kind == "bool":
            opts["action"] = argparse.BooleanOptionalAction if default is True else "store_true"
        else:
            if kind in _TYPES:
                opts["type"] = _TYPES[kind]
            if kind == "list" or kw.get("nargs"):
                opts["nargs"] = kw.get("nargs") or "*"
            choices = kw.get("choices")
            if choices is None and lit is not None:
                value = literal(lit, names)
                choices = list(value) if isinstance(value, tuple) else (
                    [value] if value is not missing else None)
            if isinstance(choices, (list, tuple)) and choices:
                opts["choices"] = list(choices)
        try:
            parser.add_argument(*flags, **opts)
        except (argparse.ArgumentError, ValueError, TypeError):
            continue  # registered by hand as well, or exotic: leave it out
