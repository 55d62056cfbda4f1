"""payload.yaml: what a payload changes in which SGLang versions, and how to verify it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ddtree_deploy.errors import ConfigError
from ddtree_deploy.yamlmodel import load_model

SHA256 = re.compile(r"^[0-9a-f]{64}$")
REL = re.compile(r"^(?!/)(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9_./-]+$")


def _rel(value: str) -> str:
    if not REL.match(value):
        raise ValueError(f"expected a relative path without '..', got {value!r}")
    return value


class Patch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str  # relative to the package
    sha256: str  # of the upstream file the patch applies to
    patch: str  # relative to the payload folder

    _t = field_validator("target", "patch")(_rel)

    @field_validator("sha256")
    @classmethod
    def _hash(cls, value: str) -> str:
        if not SHA256.match(value):
            raise ValueError(f"expected 64 lowercase hex digits, got {value!r}")
        return value


class NewFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str  # relative to the payload folder
    target: str  # relative to the package

    _t = field_validator("source", "target")(_rel)


class Support(BaseModel):
    model_config = ConfigDict(extra="forbid")
    package: str = "sglang"
    patches: list[Patch] = Field(default_factory=list)
    files: list[NewFile] = Field(default_factory=list)


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

    def targets(self, sglang_version: str) -> list[str]:
        s = self.sglang[sglang_version]
        return [p.target for p in s.patches] + [f.target for f in s.files]


def load_manifest(folder: Path) -> tuple[Manifest, Path]:
    path = folder / "payload.yaml"
    manifest = load_model(path, Manifest, "a payload manifest")
    for version, support in manifest.sglang.items():
        for rel in [p.patch for p in support.patches] + [f.source for f in support.files]:
            if not (folder / rel).is_file():
                raise ConfigError(f"{path}: sglang.{version}: {rel} is missing from {folder}")
    return manifest, folder
