"""How systemd reads a unit file, written from its documentation, for the tests only.

The oracle the unit tests hold the renderer to: a unit is right when what systemd reads
from it is exactly the `UnitCommand` the tool runs in plain mode. It follows
systemd.syntax(7), systemd.service(5) "Command lines" and systemd.exec(5), not the
renderer: lines end at LF, CR (CRLF once) and NUL only; the whitespace stripped around
lines, keys and values and between words is space, tab, CR and LF only; a line ending in
a backslash continues on the next (the backslash read as a space); `%%` is `%` (other
specifiers are refused: the renderer never writes them); words are split with double and
single quotes (which may open inside a word) and C escapes; in ExecStart `$$` becomes `$`
and `$NAME`/`${NAME}` would be expanded (refused here); WorkingDirectory= is taken
unquoted and simplified (`//` and `/./` collapsed, `..` refused).
"""

from __future__ import annotations

import re

WHITESPACE = " \t\r\n"
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", '"': '"', "'": "'", "s": " "}


class Unreadable(ValueError):
    pass


def lines(text: str) -> list[str]:
    return re.split(r"\r\n|[\r\n\0]", text)


def directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of every assignment, in order."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending: str | None = None
    for raw in lines(text):
        line = raw.strip(WHITESPACE)
        if pending is None and (not line or line[0] in "#;"):
            continue
        if pending is not None:
            line = pending + line
            pending = None
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise Unreadable(f"not an assignment: {line!r}")
        out.append((section, key.strip(WHITESPACE), value.strip(WHITESPACE)))
    return out


def specifiers(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        if value[i] == "%":
            if value[i + 1:i + 2] != "%":
                raise Unreadable(f"specifier %{value[i + 1:i + 2]} in {value!r}")
            out.append("%")
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def words(value: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    started = False
    quote = ""
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            nxt = value[i + 1:i + 2]
            if nxt == "x":
                cur.append(chr(int(value[i + 2:i + 4], 16)))
                i += 4
            elif nxt in _ESCAPES:
                cur.append(_ESCAPES[nxt])
                i += 2
            else:
                raise Unreadable(f"escape \\{nxt} in {value!r}")
            started = True
            continue
        if quote:
            if ch == quote:
                quote = ""
            else:
                cur.append(ch)
        elif ch in "\"'":
            quote, started = ch, True
        elif ch in WHITESPACE:
            if started:
                out.append("".join(cur))
                cur, started = [], False
        else:
            cur.append(ch)
            started = True
        i += 1
    if quote:
        raise Unreadable(f"unterminated quote in {value!r}")
    if started:
        out.append("".join(cur))
    return out


def dollars(word: str) -> str:
    """ExecStart's environment expansion: `$$` is `$`; a reference is refused."""
    out, i = [], 0
    while i < len(word):
        if word[i] == "$":
            nxt = word[i + 1:i + 2]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "{" or (nxt and (nxt.isalnum() or nxt == "_")):
                raise Unreadable(f"environment reference in {word!r}")
        out.append(word[i])
        i += 1
    return "".join(out)


def service(text: str) -> tuple[tuple[str, ...], dict[str, str], str]:
    """(argv, environment, working directory) systemd would run the unit's [Service] with."""
    argv: tuple[str, ...] = ()
    env: dict[str, str] = {}
    cwd = "/"
    for section, key, value in directives(text):
        if section != "Service":
            continue
        if key == "ExecStart":
            found = words(specifiers(value))
            if not found or found[0][:1] in "-@+!:|":
                raise Unreadable(f"ExecStart {value!r}")
            # the program's path is literal; argv[0] and the rest are expanded
            argv = tuple(dollars(w) for w in found)
        elif key == "Environment":
            for word in words(specifiers(value)):
                name, _, val = word.partition("=")
                env[name] = val
        elif key == "WorkingDirectory":
            path = specifiers(value)
            parts = path.split("/")
            if ".." in parts:
                raise Unreadable(f"WorkingDirectory {path!r} is not normalized")
            cwd = "/" + "/".join(p for p in parts if p not in ("", "."))
    return argv, env, cwd
