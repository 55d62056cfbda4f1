"""The overlay's data shapes, shared by manifests, the plan, the transfer and apply.

These travel as JSON: the remote manifest script prints a VenvManifest; a plan is
saved and shown as an OverlayPlan. Paths are RECORD paths, relative to
site-packages (they may climb out of it, e.g. ``../../../bin/torchrun``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Action = Literal["replace", "add", "remove", "same"]


class FileEntry(BaseModel):
    """One file of a distribution: its RECORD path, sha256 (hex) and size in bytes."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    path: str
    sha256: str
    size: int


class DistManifest(BaseModel):
    """One installed distribution: canonical name, version, dist-info folder and files."""

    model_config = ConfigDict(extra="ignore")
    name: str
    version: str
    dist_info: str
    files: list[FileEntry] = Field(default_factory=list)

    def by_path(self) -> dict[str, FileEntry]:
        return {f.path: f for f in self.files}

    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


class VenvManifest(BaseModel):
    """The matching distributions of one venv's site-packages."""

    model_config = ConfigDict(extra="ignore")
    venv: str
    site_packages: str
    python: str
    dists: dict[str, DistManifest] = Field(default_factory=dict)


class Endpoint(BaseModel):
    """Where a side of the overlay lives: a host name (hosts.yaml) and a venv path."""

    model_config = ConfigDict(extra="ignore")
    host: str
    venv: str


class DistChange(BaseModel):
    """What the overlay does to one distribution on the target.

    ``send``: new files whose content the target lacks; ``keep``: new files already
    identical on the target; ``delete``: old paths the new version no longer has;
    ``backup``: every old path of the distribution (backed up whole before the swap).
    """

    model_config = ConfigDict(extra="ignore")
    name: str
    old_version: str | None = None
    new_version: str | None = None
    action: Action
    send: list[FileEntry] = Field(default_factory=list)
    keep: list[FileEntry] = Field(default_factory=list)
    delete: list[str] = Field(default_factory=list)
    backup: list[str] = Field(default_factory=list)


class OverlayPlan(BaseModel):
    """The whole overlay: every distribution's change and the bytes still to send.

    ``bytes_to_send`` sums the sizes of unique ``send`` contents (by sha256) not in
    the workstation cache. ``id`` is the sha256 of the canonical JSON of the new
    manifests, so the same plan made twice has the same id.
    """

    model_config = ConfigDict(extra="ignore")
    lane: str
    source: Endpoint
    target: Endpoint
    changes: list[DistChange] = Field(default_factory=list)
    bytes_to_send: int = 0
    id: str


def canonical_json(value: object) -> str:
    """JSON with sorted keys and no spaces: the form hashed for ids."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def manifests_id(dists: list[DistManifest]) -> str:
    """sha256 of the canonical JSON of ``dists`` (order-independent; files sorted by path)."""
    data = [
        {
            "name": d.name,
            "version": d.version,
            "dist_info": d.dist_info,
            "files": [
                {"path": f.path, "sha256": f.sha256, "size": f.size}
                for f in sorted(d.files, key=lambda f: f.path)
            ],
        }
        for d in sorted(dists, key=lambda d: d.name)
    ]
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()
