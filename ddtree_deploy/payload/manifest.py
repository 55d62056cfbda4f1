"""payload.yaml: what a payload changes in which SGLang versions, and how to verify it.

Every name that ends up in a path on a host is checked here, before anything runs: the
package (a plain Python identifier), the payload's name and version (they name its backup
folder), each target and each file of the payload folder (relative, no '..', no hidden or
empty parts). A payload folder ships regular files: a patch or source that is a symlink is
refused, so no file from elsewhere on the workstation can be installed on a host.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ddtree_deploy.config.yamlmodel import load_model
from ddtree_deploy.errors import ConfigError

SHA256 = re.compile(r"[0-9a-f]{64}\Z")
PART = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"
REL = re.compile(rf"{PART}(?:/{PART})*\Z")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}\Z")
PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


def check_rel(value: str) -> str:
    if not REL.match(value):
        raise ValueError(f"expected a relative path of plain names (no '..', no leading '/' "
                         f"or '.'), got {value!r}")
    return value


def check_name(value: str) -> str:
    if not NAME.match(value) or ".." in value:
        raise ValueError(f"expected a name of letters, digits and . _ + - (no '/', no '..'), "
                         f"got {value!r}")
    return value


def check_sha(value: str) -> str:
    if not SHA256.match(value):
        raise ValueError(f"expected 64 lowercase hex digits, got {value!r}")
    return value


class Patch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str  # relative to the package
    sha256: str  # of the upstream file the patch applies to
    patch: str  # relative to the payload folder

    _t = field_validator("target", "patch")(check_rel)
    _h = field_validator("sha256")(check_sha)


class NewFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str  # relative to the payload folder
    target: str  # relative to the package

    _t = field_validator("source", "target")(check_rel)


class Support(BaseModel):
    model_config = ConfigDict(extra="forbid")
    package: str = "sglang"
    patches: list[Patch] = Field(default_factory=list)
    files: list[NewFile] = Field(default_factory=list)

    @field_validator("package")
    @classmethod
    def _package(cls, value: str) -> str:
        if not PACKAGE.match(value):
            raise ValueError(f"expected a Python package name (letters, digits, _), got {value!r}")
        return value

    @model_validator(mode="after")
    def _unique(self) -> Support:
        seen: set[str] = set()
        for target in [p.target for p in self.patches] + [f.target for f in self.files]:
            if target in seen:
                raise ValueError(f"target {target!r} is named twice")
            seen.add(target)
        return self


class VerifyStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    mode: Literal["light", "full"]
    code: str


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    payload: str
    version: str
    sglang: dict[str, Support]
    verify: list[VerifyStep] = Field(default_factory=list)

    _n = field_validator("payload", "version")(check_name)

    def targets(self, sglang_version: str) -> list[str]:
        s = self.sglang[sglang_version]
        return [p.target for p in s.patches] + [f.target for f in s.files]

    def digest(self, folder: Path, sglang_version: str) -> str:
        """What the payload installs for this sglang version, as one hash: the file map and
        every patch and source file's bytes. Two payloads with the same version but other
        contents differ here (a host whose payload differs is upgraded)."""
        s = self.sglang[sglang_version]
        h = hashlib.sha256(json.dumps(s.model_dump(), sort_keys=True).encode())
        for rel in sorted({p.patch for p in s.patches} | {f.source for f in s.files}):
            h.update(b"\0" + rel.encode() + b"\0" + read_file(folder, rel))
        return h.hexdigest()[:16]


MAX_FILE_BYTES = 16 << 20  # a payload file is source or a patch (the largest is ~20 KiB)


def read_file(folder: Path, rel: str) -> bytes:
    """A payload file's bytes, refused unless it is a regular file inside the folder (no
    symlink anywhere below the folder itself)."""
    root = os.path.realpath(folder)
    path = os.path.join(root, *rel.split("/"))
    if os.path.realpath(path) != path:
        raise ConfigError(f"{folder}/{rel} is a symlink (or lies under one): a payload ships "
                          "its own regular files")
    try:  # O_NONBLOCK: opening a FIFO waited for a writer that never comes
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ConfigError(f"{folder}/{rel}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise ConfigError(f"{folder}/{rel} is not a regular file")
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{folder}/{rel} is larger than {MAX_FILE_BYTES >> 20} MiB: not a "
                          "payload's source or patch")
    return data


def read_text(folder: Path, rel: str) -> str:
    try:
        return read_file(folder, rel).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{folder}/{rel}: not UTF-8 text (byte {exc.start})") from None


def load_manifest(folder: Path) -> tuple[Manifest, Path]:
    path = folder / "payload.yaml"
    manifest = load_model(path, Manifest, "a payload manifest")
    for version, support in manifest.sglang.items():
        for rel in [p.patch for p in support.patches] + [f.source for f in support.files]:
            if not (folder / rel).exists() and not (folder / rel).is_symlink():
                raise ConfigError(f"{path}: sglang.{version}: {rel} is missing from {folder}")
            read_file(folder, rel)  # a symlink or a folder: refused here, before any host
        for p in support.patches:
            read_text(folder, p.patch)
    return manifest, folder


def shipped_identity(sglang_version: str | None) -> tuple[str, str, str] | None:
    """(payload, version, digest) of the built-in payload for this sglang version (the plugin
    wheel's for a plugin release: its name, version and sha256); None when it does not support
    the version."""
    from ddtree_deploy.resources import data_path

    manifest, folder = load_manifest(data_path("payload"))
    if sglang_version in manifest.sglang:
        return manifest.payload, manifest.version, manifest.digest(folder, sglang_version)
    from ddtree_deploy.rules.matrix import load_matrix

    if load_matrix(folder, list(manifest.sglang)).form(sglang_version) == "plugin":
        import tempfile

        from ddtree_deploy.payload.plugin import build_wheel

        # built where nothing stays (the same bytes every run): plan writes no cache of its own
        with tempfile.TemporaryDirectory(prefix="ddtree-plugin-identity-") as tmp:
            return build_wheel(folder, Path(tmp)).identity
    return None
