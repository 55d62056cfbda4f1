"""Pydantic's validation errors, said in plain English for a person editing hosts.yaml.

``english(error, model)`` turns one entry of ``ValidationError.errors()`` into
"what was expected, what was got" (``must be 1-65535, got 70000``); pydantic's
own wording and its documentation URLs never reach the user.
"""

from __future__ import annotations

import difflib
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

_EXPECTED: dict[str, str] = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "list_type": "expected a list",
    "is_instance_of": "expected a path",
    "finite_number": "expected a finite number",
}


def describe(value: Any) -> str:
    """A value as the user wrote it: 'abc' for text, 70000, true, null, a list, a mapping."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        # a line break said raw would start a line of its own (a forged "error: ...")
        return f"'{text}'" if text.isprintable() else repr(text)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and Optional[...] down to the type that matters."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            rest = [a for a in get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping found at ``loc`` below ``model``."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif get_origin(current) is dict:
            current = get_args(current)[1]
        elif get_origin(current) is list:
            current = get_args(current)[0]
        else:
            return None
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return current
    return None


def _unknown_field(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    owner = model_at(model, loc[:-1])
    if owner is None:
        return "unknown field"
    allowed = [name for name in owner.model_fields if name != "name"]
    key = str(loc[-1])
    # a look-alike ('pоrt' with a Cyrillic о) reads as the field it is not: name the odd letters
    odd = sorted({f"U+{ord(c):04X}" for c in key if not c.isascii()})
    lookalike = f"; it holds {', '.join(odd)}, not ASCII letters" if odd else ""
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return f"unknown field (did you mean '{close[0]}'?{lookalike})"
    return f"unknown field; expected one of: {', '.join(allowed)}{lookalike}"


def english(error: Any, model: type[BaseModel]) -> str:
    """One pydantic error (a dict from ``errors()``) as 'expected X, got Y'."""
    kind: str = error["type"]
    loc = tuple(p for p in error["loc"] if p != "[key]")
    ctx: dict[str, Any] = error.get("ctx") or {}
    value = error.get("input")
    if kind in ("settings_rule", "host_fit"):  # settings.model's rules: complete sentences
        return str(ctx.get("error", error["msg"]))
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return _unknown_field(model, loc)
    if kind in ("value_error", "assertion_error"):
        expected = str(ctx.get("error", error["msg"]))
        if isinstance(value, dict | list):  # a check of a whole mapping: the value says nothing
            return expected
        if getattr(ctx.get("error"), "hide_value", False):  # a secret: not echoed to a log
            return expected
    elif kind in ("literal_error", "enum"):
        expected = f"expected {ctx.get('expected', '')}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        words = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
                 "less_than_equal": "<="}  # fmt: skip
        limit = next(iter(ctx.values()), "")
        expected = f"must be {words[kind]} {limit}"
    elif kind in _EXPECTED:
        expected = _EXPECTED[kind]
    else:
        expected = str(error.get("msg", "invalid value")).rstrip(".")
    return f"{expected}, got {describe(value)}"
