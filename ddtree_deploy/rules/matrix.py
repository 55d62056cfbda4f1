"""The SGLang releases the DDTree payload serves, and in which form (data the rules, plan and
the payload tool share).

- the patch set: the versions payload.yaml lists (`sglang:`; 0.5.11), patched into the package;
- the plugin: the releases `payload/plugin/ddtree_sglang/releases.py` lists in `SUPPORTED`
  (0.5.17 ... 0.5.23), installed as the `ddtree-sglang-plugin` wheel that SGLang loads itself
  through its `sglang.srt.plugins` entry points; `REFUSED` names releases read and refused,
  with the reason.

releases.py is the plugin's own list (it refuses the others at load); it is read here by its
file, with ast (no import of it, sglang or torch), so facts, doctor and plan stay light.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version

from ddtree_deploy.errors import ConfigError

Form = Literal["patch", "plugin"]
RELEASES = Path("plugin") / "ddtree_sglang" / "releases.py"


def _key(version: str) -> tuple[int, Version | str]:
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)


@dataclass(frozen=True)
class Matrix:
    patch: tuple[str, ...]
    plugin: tuple[str, ...]
    refused: dict[str, str] = field(default_factory=dict)

    def form(self, version: str | None) -> Form | None:
        if version in self.patch:
            return "patch"
        if version in self.plugin:
            return "plugin"
        return None

    @property
    def versions(self) -> list[str]:
        return sorted({*self.patch, *self.plugin}, key=_key)

    def listing(self) -> str:
        """'0.5.11 (patch set), 0.5.17, 0.5.19 (plugin)'."""
        parts = []
        if self.patch:
            parts.append(", ".join(sorted(self.patch, key=_key)) + " (patch set)")
        if self.plugin:
            parts.append(", ".join(sorted(self.plugin, key=_key)) + " (plugin)")
        return "; ".join(parts) or "none"

    def refusal(self, version: str | None) -> str:
        """Why `version` is not served, with the supported list."""
        shown = version or "none installed"
        why = self.refused.get(version or "")
        return (f"the DDTree payload does not support sglang {shown}"
                + (f" ({why})" if why else "") + f"; supported: {self.listing()}")


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    for node in tree.body:
        target: ast.expr
        value: ast.expr | None
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == name:
            return value
    return None


def read_releases(path: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    """(SUPPORTED's versions, REFUSED) of the plugin's releases.py, read without running it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the plugin's release list ({exc})") from None
    supported = _assigned(tree, "SUPPORTED")
    if not isinstance(supported, ast.Dict) or not all(
            isinstance(k, ast.Constant) and isinstance(k.value, str) for k in supported.keys):
        raise ConfigError(f"{path}: SUPPORTED: expected a dict literal keyed by version strings")
    versions = tuple(str(k.value) for k in supported.keys if isinstance(k, ast.Constant))
    refused_node = _assigned(tree, "REFUSED")
    refused: dict[str, str] = {}
    if refused_node is not None:
        try:
            value = ast.literal_eval(refused_node)
        except ValueError:
            value = None
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ConfigError(f"{path}: REFUSED: expected a dict of version -> reason strings")
        refused = value
    return versions, refused


def load_matrix(folder: Path, patch_versions: list[str]) -> Matrix:
    """The matrix of a payload folder (its manifest's versions given)."""
    releases = folder / RELEASES
    plugin, refused = read_releases(releases) if releases.is_file() else ((), {})
    return Matrix(tuple(patch_versions), plugin, refused)


def shipped_matrix() -> Matrix:
    """The matrix of the payload this tool ships (the patch set's versions: the keys of its
    payload.yaml's `sglang:`, read with the bounded loader; payload/manifest.py validates the
    rest where the payload is deployed)."""
    from ddtree_deploy.config.yamlload import load_yaml_file
    from ddtree_deploy.resources import data_path

    folder = data_path("payload")
    doc = load_yaml_file(folder / "payload.yaml")
    data = doc.data if isinstance(doc.data, dict) else {}
    patch = data.get("sglang")
    return load_matrix(folder, [str(v) for v in patch] if isinstance(patch, dict) else [])
