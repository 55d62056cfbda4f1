"""Write a recommended configuration into a deployment of hosts.yaml, keeping the file's
comments, order and layout (ruamel.yaml round trip), shown as a diff first.

Refused (exit 2): the embedded default hosts file (it ships with the tool; write your own and
pass it with --hosts), a deployment that is not in the file, and a value that comes from an
anchor or a merge key (`<<: *common`): changing it here would silently change every other
place that shares it, or split it off without saying so. The new text is validated as a hosts
file before it is written, and written atomically.
"""

from __future__ import annotations

import difflib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

from ddtree_deploy.bench.recommend import Choice
from ddtree_deploy.errors import ConfigError, UsageError

KEYS = ("algorithm", "ddtree")


def _yaml() -> Any:
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096
    return y


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
    try:
        old = path.read_text(encoding="utf-8")
        doc = _yaml().load(old)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    deps = doc.get("deployments") if isinstance(doc, dict) else None
    if not isinstance(deps, dict) or deployment not in deps:
        raise UsageError(f"{path}: no deployment '{deployment}' to write into")
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
        del dep["ddtree"]  # only allowed with algorithm: ddtree
    _keep_anchors(doc)
    buf = io.StringIO()
    _yaml().dump(doc, buf)
    return old, buf.getvalue()


def diff(path: Path, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        fromfile=str(path), tofile=f"{path} (recommended)"))


def write(path: Path, new: str) -> None:
    """Validate `new` as a hosts file, then replace `path` with it atomically."""
    from ddtree_deploy.config.hosts import load_config

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".yaml", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(new)
        load_config(tmp)  # raises ConfigError (exit 2) if the edit broke the file
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
