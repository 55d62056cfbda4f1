"""Read a YAML file into plain Python values, remembering the line of every node.

PyYAML's own loaders forget where values came from and silently keep the last
of two equal keys. Here the file is composed into nodes (which carry marks) and
converted by hand, so that:

- every mapping key and value has a 1-based line, addressed by its path
  (``("hosts", "ct200", "port")``, list items by index);
- a key given twice in one mapping is reported (not silently overwritten);
- syntax errors, an empty file and bytes that are not UTF-8 become a
  ConfigError naming the file, line and column.

Scalars are typed by the safe loader's rules (``22`` is an int, ``true`` a bool,
``null`` None). A tag other than the plain ones (``!!str``, ``!!int``, ``!!map`` ...)
is refused on any node, a string holding a NUL character is refused (no path,
name or command can hold one), and so is a number YAML 1.1 reads otherwise than a
person or YAML 1.2 would (``030001`` is octal 12289, ``500:01`` base 60; also ``0x``,
``0b`` and ``_``-grouped digits): plain decimal digits only.

Hostile documents are refused while they are composed, before anything is built
from them, each with its file and line: an alias that refers to a node still
being composed (a node that would contain itself), alias expansion beyond
MAX_NODES nodes (a "billion laughs" document is a few hundred bytes), nesting
deeper than MAX_DEPTH, and files that are not regular files or are larger than
MAX_BYTES.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError

from ddtree_deploy.errors import ConfigError

PathKey = tuple[str | int, ...]

MERGE_TAG = "tag:yaml.org,2002:merge"
INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"
_LINE_BREAKS_YAML_ONLY = re.compile("[\x85\u2028\u2029]")  # NEL, LS, PS
_DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)\Z")
MAP_TAG = "tag:yaml.org,2002:map"
SEQ_TAG = "tag:yaml.org,2002:seq"
SCALAR_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in
                        ("str", "int", "float", "bool", "null", "timestamp", "merge"))
MAX_NODES = 100_000  # nodes after alias expansion (the largest shipped file has ~150)
MAX_DEPTH = 64  # nesting of lists and mappings
MAX_BYTES = 4 << 20  # a YAML file larger than this is not a hand-written configuration


class _Refused(ComposerError):
    """A document refused before it is built (not a syntax error)."""


class _Bounded(yaml.SafeLoader):
    """The safe loader's composer, counting what aliases expand to and refusing, at the
    alias or node that crosses the line, a recursive alias, too many nodes, too deep a
    nesting (PyYAML composes recursively: a deep document would end in RecursionError)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._open_anchors: set[str] = set()
        self._expanded: dict[int, int] = {}  # id(node) -> its node count, aliases expanded
        self._total = 0
        self._depth = 0

    def _refuse(self, message: str, event: NodeEvent) -> None:
        raise _Refused(None, None, message, event.start_mark)  # type: ignore[arg-type]

    def _count(self, n: int, event: NodeEvent) -> None:
        self._total += n
        if self._total > MAX_NODES:
            self._refuse(f"the document expands to more than {MAX_NODES} nodes "
                         "(aliases repeating aliases); refused before building it", event)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self._open_anchors:
                self._refuse(f"recursive alias *{event.anchor}: it refers to a node that "
                             "contains it", event)
            node = super().compose_node(parent, index)
            self._count(self._expanded.get(id(node), 1), event)
            return node
        anchor = getattr(event, "anchor", None)
        if isinstance(event, CollectionStartEvent):
            self._depth += 1
            if self._depth > MAX_DEPTH:
                self._refuse(f"nested more than {MAX_DEPTH} levels deep", event)
        if anchor is not None:
            self._open_anchors.add(anchor)
        before = self._total
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open_anchors.discard(anchor)
        if isinstance(event, CollectionStartEvent):
            self._depth -= 1
        self._count(1, event)
        if node is not None:
            self._expanded[id(node)] = self._total - before
        return node


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a file: where (line, field path) and what."""

    line: int
    path: PathKey
    message: str

    def render(self, file: str) -> str:
        """``hosts.yaml:14: hosts.ct200.port: must be 1-65535, got 70000``."""
        where = dotted(self.path)
        prefix = f"{file}:{self.line}: "
        return f"{prefix}{where}: {self.message}" if where else prefix + self.message


@dataclass
class LoadedYaml:
    """A document as plain values plus the line of each key and value."""

    data: Any
    key_lines: dict[PathKey, int] = field(default_factory=dict)
    value_lines: dict[PathKey, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    unreadable: list[PathKey] = field(default_factory=list)  # values replaced by None

    def line_of(self, path: PathKey) -> int:
        """Line of the node at ``path``; for a missing node, the line of its nearest parent.

        A mapping entry is located by its key (the line a reader looks at for
        ``venvs:``), a list item by its first line.
        """
        probe = tuple(path)
        while probe:
            if probe in self.key_lines:
                return self.key_lines[probe]
            if probe in self.value_lines:
                return self.value_lines[probe]
            probe = probe[:-1]
        return self.value_lines.get((), 1)


MAX_SHOWN = 20  # problems said one per line; a file of thousands says how many more


def render_problems(problems: list[Problem], file: str) -> str:
    """The problems of `file`, one a line, the first MAX_SHOWN and how many more: a file
    wrong in 15,000 places is not 15,000 lines (a megabyte) of error."""
    lines = [p.render(file) for p in problems[:MAX_SHOWN]]
    if len(problems) > MAX_SHOWN:
        lines.append(f"{file}: ... and {len(problems) - MAX_SHOWN} more problems "
                     f"(the first {MAX_SHOWN} are shown)")
    return "\n".join(lines)


def dotted(path: PathKey) -> str:
    """``("deployments", "x", "extra_args", 2)`` -> ``deployments.x.extra_args[2]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def path_part(key: Any) -> str:
    """How a mapping key appears in a path: as text (``7:`` is "7"; list items are ints)."""
    return key if isinstance(key, str) else str(key)


def _describe_key(key: Any) -> str:
    return repr(key) if isinstance(key, str) else str(key)


class _Builder:
    def __init__(self, result: LoadedYaml) -> None:
        self.result = result
        self.constructor = yaml.SafeLoader("")  # used only to type scalars

    def build(self, node: Node, path: PathKey) -> Any:
        self.result.value_lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        if not self._plain_tag(node, path, SEQ_TAG if isinstance(node, SequenceNode) else MAP_TAG):
            return None
        if isinstance(node, SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        if isinstance(node, MappingNode):
            return self._mapping(node, path)
        self._problem(node, path, f"unsupported YAML node {type(node).__name__}")
        return None

    def _problem(self, node: Node, path: PathKey, message: str) -> None:
        self.result.problems.append(Problem(node.start_mark.line + 1, path, message))

    def _plain_tag(self, node: Node, path: PathKey, *allowed: str) -> bool:
        if node.tag in allowed or (isinstance(node, ScalarNode) and node.tag in SCALAR_TAGS):
            return True
        self._problem(node, path,
                      f"YAML tags are not accepted, got {node.tag} (write the value plainly)")
        self.result.unreadable.append(path)
        return False

    def _scalar(self, node: ScalarNode, path: PathKey) -> Any:
        if not self._plain_tag(node, path):
            return None
        try:
            value = self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            self._problem(node, path, f"cannot read this value: {problem}")
            self.result.unreadable.append(path)
            return None
        form = _number_form(node)
        if form is not None:
            self._problem(node, path, f"{node.value} is read as {value} ({form}, as YAML 1.1 reads "
                          "it): write the number in plain decimal digits, or quote it if it "
                          "is text")
            self.result.unreadable.append(path)
            return None
        if isinstance(value, str) and "\0" in value:
            self._problem(node, path, "contains a NUL character (\\0), which no path, name "
                          "or command can hold")
            self.result.unreadable.append(path)
            return None
        return value

    def _mapping(self, node: MappingNode, path: PathKey) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        merged: list[tuple[Node, Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                merged.extend(self._merge_sources(value_node, path))
                continue
            key = self.build_key(key_node, path)
            if key is None and not isinstance(key_node, ScalarNode):
                continue
            line = key_node.start_mark.line + 1
            sub = (*path, path_part(key))
            if key in first_line:
                self._problem(
                    key_node,
                    sub,
                    f"duplicate key {_describe_key(key)} (first given on line {first_line[key]})",
                )
                continue
            first_line[key] = line
            self.result.key_lines[sub] = line
            if isinstance(key, int):  # validators name a key 7 by the integer
                self.result.key_lines[(*path, key)] = line
            out[key] = self.build(value_node, sub)
        # `<<: *anchor` entries fill in keys the mapping did not give itself.
        for key_node, value_node in merged:
            key = self.build_key(key_node, path)
            if key in out or key in first_line:
                continue
            sub = (*path, path_part(key))
            first_line[key] = key_node.start_mark.line + 1
            self.result.key_lines[sub] = first_line[key]
            out[key] = self.build(value_node, sub)
        return out

    def build_key(self, key_node: Node, path: PathKey) -> Any:
        if not isinstance(key_node, ScalarNode):
            self._problem(
                key_node, path, "a mapping key must be a plain value, not a list or mapping"
            )
            return None
        key = self._scalar(key_node, path)
        if not isinstance(key, Hashable):
            self._problem(key_node, path, "a mapping key must be a plain value")
            return None
        return key

    def _merge_sources(self, value_node: Node, path: PathKey) -> list[tuple[Node, Node]]:
        sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
        pairs: list[tuple[Node, Node]] = []
        for source in sources:
            if not isinstance(source, MappingNode):
                self._problem(source, path, "'<<' must refer to a mapping")
                continue
            pairs.extend(source.value)
        return pairs


def _number_form(node: ScalarNode) -> str | None:
    """How a number written other than in plain decimal is read: YAML 1.1 (PyYAML) reads
    030001 as octal 12289 and 500:01 as base 60, where YAML 1.2 and a reader see other
    values; such a number is refused rather than guessed."""
    text = node.value
    if node.tag == INT_TAG and not _DECIMAL_INT.match(text):
        digits = text.lstrip("+-")
        if ":" in digits:
            return "base 60"
        if "_" in digits:
            return "digits grouped with '_'"
        if digits[:2] in ("0x", "0b"):
            return "hexadecimal" if digits[1] == "x" else "binary"
        return "octal"
    if node.tag == FLOAT_TAG and (":" in text or "_" in text):
        return "base 60" if ":" in text else "digits grouped with '_'"
    return None


def _decode(raw: bytes, file: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        bad = raw[exc.start : exc.start + 1].hex()
        raise ConfigError(
            f"{file}:{line}: not a UTF-8 text file (byte 0x{bad} at offset {exc.start})"
        ) from None


def _unreadable_character(text: str, exc: ReaderError, file: str) -> str:
    position = exc.position
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    return (f"{file}:{line}:{column}: a character YAML does not accept: U+{exc.character:04X} "
            "(a control character or a non-character); in a double-quoted string write it "
            "as an escape (\\x01), or remove it")


def parse_yaml(text: str, file: str) -> LoadedYaml:
    """Compose one YAML document from ``text`` (``file`` names it in messages)."""
    odd = _LINE_BREAKS_YAML_ONLY.search(text)
    if odd:  # YAML breaks lines there, an editor does not: every line number after it is off
        line = text.count("\n", 0, odd.start()) + 1
        column = odd.start() - (text.rfind("\n", 0, odd.start()) + 1) + 1
        raise ConfigError(f"{file}:{line}:{column}: a raw U+{ord(odd.group()):04X} (a line "
                          "separator to YAML, not to an editor, which would put what follows "
                          "on another line than it shows); remove it, or write it as an escape "
                          "in a double-quoted string")
    try:  # the reader refuses a raw control character (NUL, BEL, U+FFFE) as it is made
        loader = _Bounded(text)
    except ReaderError as exc:
        raise ConfigError(_unreadable_character(text, exc, file)) from None
    try:
        node = loader.get_single_node()
    except _Refused as exc:
        mark = exc.problem_mark
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else file
        raise ConfigError(f"{where}: refused: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "invalid YAML"
        if exc.problem and exc.context and not exc.context.startswith("while"):
            what = f"{exc.context}, {exc.problem}"  # "expected a single document ..., but ..."
        if mark is None:
            raise ConfigError(f"{file}: YAML syntax error: {what}") from None
        raise ConfigError(
            f"{file}:{mark.line + 1}:{mark.column + 1}: YAML syntax error: {what}"
        ) from None
    except ReaderError as exc:
        raise ConfigError(_unreadable_character(text, exc, file)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: YAML syntax error: {exc}") from None
    finally:
        loader.dispose()
    result = LoadedYaml(data=None)
    if node is None:
        return result
    result.data = _Builder(result).build(node, ())
    return result


def read_config_bytes(path: Path, what: str = "a YAML file", limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; a FIFO, a device (/dev/zero), a
    folder or a huge file is refused without reading it (ConfigError naming the file). The
    one bounded reader of every file the user names as input (hosts.yaml, grids, results)."""
    file = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{file}: is a directory, expected {what}") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"{file}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{file}: is a directory, expected {what}")
        raise ConfigError(f"{file}: not a regular file (a pipe, socket or device), "
                          f"expected {what}")
    with os.fdopen(fd, "rb") as f:
        try:
            raw = f.read(limit + 1)
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
        raise ConfigError(f"{file}: larger than {size}, expected {what}")
    return raw


def load_yaml_file(path: Path, what: str = "a YAML file") -> LoadedYaml:
    """Read and parse ``path``; every failure is a ConfigError naming the file as given."""
    return parse_yaml(_decode(read_config_bytes(path, what), str(path)), str(path))


def decode_utf8(raw: bytes, file: str) -> str:
    """UTF-8 text (a BOM allowed) or a ConfigError naming the file, line and offset."""
    return _decode(raw, file)
