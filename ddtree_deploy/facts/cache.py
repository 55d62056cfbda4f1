"""Facts cached under the XDG state folder, with the time they were taken.

One file per host, keyed by the host's name and where it is reached (so two
hosts files naming different machines "ct200" do not share facts). Commands
that change a host call drop() so that the next reader gathers anew.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from pydantic import ValidationError

from ddtree_deploy import paths
from ddtree_deploy.config import HostSpec
from ddtree_deploy.facts.model import SCHEMA_VERSION, Facts

DEFAULT_MAX_AGE_S = 300.0


class FactsCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or paths.state_dir() / "facts"

    def _file(self, spec: HostSpec) -> Path:
        where = f"{spec.target}:{spec.port}:{spec.user}:{spec.transport}"
        return self.root / f"{spec.name}-{hashlib.sha256(where.encode()).hexdigest()[:10]}.json"

    def load(self, spec: HostSpec, max_age_s: float = DEFAULT_MAX_AGE_S) -> Facts | None:
        """Fresh facts for the host, or None (missing, too old, unreadable, older schema)."""
        path = self._file(spec)
        try:
            facts = Facts.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, ValidationError):
            return None
        if facts.schema_version != SCHEMA_VERSION or time.time() - facts.taken_at > max_age_s:
            return None
        return facts

    def save(self, spec: HostSpec, facts: Facts) -> Path:
        path = self._file(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(facts.model_dump_json(indent=1), encoding="utf-8")
        tmp.replace(path)
        return path

    def drop(self, spec: HostSpec) -> None:
        self._file(spec).unlink(missing_ok=True)

    def age_s(self, spec: HostSpec) -> float | None:
        try:
            return time.time() - self._file(spec).stat().st_mtime
        except OSError:
            return None
