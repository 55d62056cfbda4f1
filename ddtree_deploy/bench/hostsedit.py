"""Write a recommended configuration into a deployment of hosts.yaml, keeping the file's
comments, order and layout (ruamel.yaml round trip), shown as a diff first.

Refused (exit 2): the embedded default hosts file (it ships with the tool; write your own and
pass it with --hosts), a deployment that is not in the file, and a value that comes from an
anchor or a merge key (`<<: *common`): changing it here would silently change every other
place that shares it, or split it off without saying so. The new text is validated as the
hosts file (problems name it, not a temporary) before anything is written.

Kept as the file had them: its line endings (CRLF stays CRLF), a UTF-8 BOM, the indentation
of mappings and sequences (read from the file, not ruamel's defaults), the comments after a
`ddtree:` block that is removed (moved onto the key before it), and on writing its owner,
mode and symlink (a linked hosts.yaml is written through the link, so every place sharing it
sees the new value): `atomicfile.replace_file`, atomic and without leftovers, SIGTERM
included.
"""

from __future__ import annotations

import difflib
import io
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from ddtree_deploy.bench.recommend import Choice
from ddtree_deploy.errors import ConfigError, UsageError

KEYS = ("algorithm", "ddtree")


_BLOCK_KEY = re.compile(r"^( *)[^\s#-][^#]*:\s*(#.*)?$")


def _indentation(text: str) -> tuple[int, int, int]:
    """(mapping, sequence, offset) for ruamel, as the file indents its blocks: the most
    common step from a `key:` line to the block under it."""
    lines = [line for line in text.splitlines() if line.strip() and
             not line.lstrip().startswith("#")]
    maps: Counter[int] = Counter()
    seqs: Counter[int] = Counter()
    for prev, cur in zip(lines, lines[1:], strict=False):
        m = _BLOCK_KEY.match(prev)
        if not m:
            continue
        step = len(cur) - len(cur.lstrip(" ")) - len(m.group(1))
        if cur.lstrip(" ").startswith("- ") and step >= 0:
            seqs[step] += 1
        elif step > 0:
            maps[step] += 1
    mapping = maps.most_common(1)[0][0] if maps else 2
    offset = seqs.most_common(1)[0][0] if seqs else 0
    return mapping, max(offset + 2, mapping if offset else 2), offset


_HEAD = re.compile(r"(?:[ \t]*(?:#.*)?\n|%.*\n)*---[ \t]*(?:#.*)?\n")


def _reframed(old: str, new: str) -> str:
    """`new` (ruamel's dump) in the frame of `old`: its directives and `---` above the
    document, and what follows the last line of content (`...`, blank lines, no final
    newline), which ruamel does not keep."""
    head = _HEAD.match(old)
    lines = new.split("\n")
    if head:
        above = head.group(0).split("\n")
        while lines and (lines[0].startswith(("%", "---")) or lines[0] in above):
            lines.pop(0)  # directives, `---` and the comments above it: in the head already

    def content_end(items: list[str]) -> int:
        end = len(items)
        while end and (not items[end - 1].strip() or items[end - 1].startswith("...")):
            end -= 1
        return end

    old_lines = old.split("\n")
    body = lines[:content_end(lines)]
    return (head.group(0) if head else "") + "\n".join(body + old_lines[content_end(old_lines):])


def _yaml(text: str = "") -> Any:
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096
    mapping, sequence, offset = _indentation(text)
    y.indent(mapping=mapping, sequence=sequence, offset=offset)
    return y


def _trailing_comment(node: Any) -> str:
    """The comment lines that follow a block (ruamel keeps them on its last key or item)."""
    while isinstance(node, dict | list) and node:
        last = list(node)[-1] if isinstance(node, dict) else len(node) - 1
        child = node[last]
        if isinstance(child, dict | list) and child:
            node = child
            continue
        ca = getattr(node, "ca", None)
        token = ca.items.get(last) if ca is not None else None
        comment = token[2] if token and len(token) > 2 else None
        value = getattr(comment, "value", "") or ""
        return value.partition("\n")[2]
    return ""


def _keep_comment_of_removed(dep: Any, key: str) -> None:
    """Before `key` is deleted from `dep`, move the comment lines after its block onto the
    key before it, where they will still be read in the same place."""
    rest = _trailing_comment(dep[key])
    keys = list(dep)
    at = keys.index(key)
    if not rest.strip() or at == 0:
        return
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    prev = keys[at - 1]
    slot = dep.ca.items.setdefault(prev, [None, None, None, None])
    if slot[2] is not None:
        slot[2].value = slot[2].value.rstrip("\n") + "\n" + rest
    else:
        slot[2] = CommentToken("\n" + rest, CommentMark(0), None)


def _anchored(node: Any) -> bool:
    anchor = getattr(node, "anchor", None)
    return getattr(anchor, "value", None) is not None


def _merged_keys(node: Any) -> set[str]:
    """Keys a mapping gets from `<<` merges rather than from its own lines."""
    own = getattr(node, "_ok", None)
    if own is None or not isinstance(node, dict):
        return set()
    return {str(k) for k in node if k not in own}


def _keep_anchors(node: Any, seen: set[int] | None = None) -> None:
    """ruamel drops an anchor no alias refers to; every anchor of the file is kept."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    anchor: Any = getattr(node, "anchor", None)
    if anchor is not None and getattr(anchor, "value", None) is not None:
        anchor.always_dump = True
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        _keep_anchors(child, seen)


def _line(node: Any, key: str) -> int | None:
    try:
        return int(node.lc.key(key)[0]) + 1
    except (AttributeError, KeyError, TypeError):
        return None


def new_text(path: Path, deployment: str, choice: Choice) -> tuple[str, str]:
    """(old text, new text) with the choice written into the deployment; refusals raise."""
    from ruamel.yaml.error import YAMLError

    from ddtree_deploy.resources import embedded_hosts_file

    try:
        if path.resolve() == embedded_hosts_file().resolve():
            raise UsageError(f"{path} is the embedded default hosts file; bench recommend does "
                             "not edit it", hint="copy it, pass the copy with --hosts FILE "
                             "(or $DDTREE_DEPLOY_HOSTS), and run recommend again")
    except FileNotFoundError:
        pass
    from ddtree_deploy.config.yamlload import decode_utf8, read_config_bytes

    raw = read_config_bytes(path, "a hosts file")
    old = decode_utf8(raw, str(path))
    bom = "\ufeff" if raw.startswith(b"\xef\xbb\xbf") else ""
    crlf = old.count("\r\n") > old.count("\n") / 2
    plain = old.replace("\r\n", "\n")
    try:
        doc = _yaml(plain).load(plain)
    except YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    deps = doc.get("deployments") if isinstance(doc, dict) else None
    if not isinstance(deps, dict) or deployment not in deps:
        raise UsageError(f"{path}: no deployment {deployment!r} to write into")
    dep = deps[deployment]
    where = f"{path}:{_line(deps, deployment) or '?'}: deployments.{deployment}"
    if _anchored(dep) or deployment in _merged_keys(deps):
        raise UsageError(f"{where}: the deployment is an anchor shared with other places; "
                         "edit it by hand", hint="or give this deployment its own values")
    from_merge = sorted(set(KEYS) & _merged_keys(dep))
    if from_merge:
        raise UsageError(f"{where}.{from_merge[0]}: the value comes from a merge key (<<: "
                         "*anchor) shared with other deployments; bench does not split it off",
                         hint="set the value in this deployment itself first")
    for key in KEYS:
        if key in dep and _anchored(dep[key]):
            raise UsageError(f"{path}:{_line(dep, key) or '?'}: deployments.{deployment}.{key}: "
                             "the value is an anchor shared with other places; edit it by hand")
    dep["algorithm"] = choice.algorithm
    if choice.algorithm == "ddtree":
        tree = dep.get("ddtree")
        if not isinstance(tree, dict):
            from ruamel.yaml.comments import CommentedMap

            tree = CommentedMap()
            keys = list(dep)
            dep.insert(keys.index("algorithm") + 1, "ddtree", tree)
        tree["budget"] = choice.budget
        tree["topk"] = choice.topk
        tree["shadow_linear"] = choice.shadow_linear
    elif "ddtree" in dep:
        _keep_comment_of_removed(dep, "ddtree")
        del dep["ddtree"]  # only allowed with algorithm: ddtree
    _keep_anchors(doc)
    buf = io.StringIO()
    _yaml(plain).dump(doc, buf)
    new = _reframed(plain, buf.getvalue())
    if crlf:
        new = new.replace("\r\n", "\n").replace("\n", "\r\n")
    return bom + old, bom + new


def diff(path: Path, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        fromfile=str(path), tofile=f"{path} (recommended)"))


def write(path: Path, new: str) -> None:
    """Validate `new` as the hosts file at `path`, then replace the file atomically, through
    a symlink, keeping its owner and mode (refusals name `path`, exit 2)."""
    from ddtree_deploy.atomicfile import replace_file
    from ddtree_deploy.config.hosts import load_config

    load_config(path, text=new.removeprefix("\ufeff"))  # ConfigError if the edit broke it
    try:
        st = os.stat(path)
    except OSError:
        st = None
    links = st.st_nlink if st is not None else 1
    if st is not None and not st.st_mode & 0o222:
        raise UsageError(f"{path} is read-only (mode {st.st_mode & 0o7777:04o}); bench recommend "
                         "does not replace it", hint="make it writable first (chmod u+w)")
    if links > 1:
        raise UsageError(f"{path} has {links} hard links: replacing it would leave the other "
                         "names with the old text", hint="edit it by hand, or make it a "
                         "symlink (written through)")
    replace_file(path, new.encode("utf-8"), keep=True, through_link=True)
