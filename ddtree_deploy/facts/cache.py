"""Facts cached under the XDG state folder, with the time they were taken.

One file per host and what its facts were gathered for: keyed by the host's
name, where it is reached (so two hosts files naming different machines "ct200"
do not share facts) and the venvs and model folders its entry declares (facts
gathered before hosts.yaml changed them answer for other venvs: never used).
Commands that change a host call drop(), which removes the host's facts whatever
they were gathered for, so that the next reader gathers anew.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from pydantic import ValidationError

from ddtree_deploy import xdg
from ddtree_deploy.atomicfile import replace_file
from ddtree_deploy.config.hosts import HostSpec
from ddtree_deploy.facts.model import SCHEMA_VERSION, Facts

DEFAULT_MAX_AGE_S = 300.0


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def gathered_for(spec: HostSpec) -> str:
    """What a host's facts are gathered for: the venvs and model folders its entry names."""
    return json.dumps({"venvs": sorted(str(v.path) for v in spec.venvs.values()),
                       "models": sorted(str(p) for p in spec.models.values())})


class FactsCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or xdg.state_dir() / "facts"

    def _prefix(self, spec: HostSpec) -> str:
        where = f"{spec.target}:{spec.port}:{spec.user}:{spec.transport}"
        return f"{spec.name}-{_digest(where)}"

    def _file(self, spec: HostSpec) -> Path:
        return self.root / f"{self._prefix(spec)}-{_digest(gathered_for(spec))}.json"

    def load(self, spec: HostSpec, max_age_s: float = DEFAULT_MAX_AGE_S) -> Facts | None:
        """Fresh facts for the host, or None (missing, too old, unreadable, older schema)."""
        from ddtree_deploy.config.yamlload import read_config_bytes
        from ddtree_deploy.errors import ConfigError

        path = self._file(spec)
        try:  # the bounded reader: a FIFO or device planted there is skipped, never waited on
            facts = Facts.model_validate_json(read_config_bytes(path, "facts", limit=64 << 20))
        except (ConfigError, ValueError, ValidationError):
            return None
        if facts.schema_version != SCHEMA_VERSION or time.time() - facts.taken_at > max_age_s:
            return None
        return facts

    def save(self, spec: HostSpec, facts: Facts) -> Path:
        """Write the host's facts atomically (atomicfile: no temporary left on a full disk;
        a failure names the file, exit 1)."""
        path = self._file(spec)
        replace_file(path, facts.model_dump_json(indent=1).encode("utf-8"), mode=0o600)
        return path

    def drop(self, spec: HostSpec) -> None:
        for path in self.root.glob(f"{self._prefix(spec)}*.json"):
            path.unlink(missing_ok=True)

    def age_s(self, spec: HostSpec) -> float | None:
        try:
            return time.time() - self._file(spec).stat().st_mtime
        except OSError:
            return None
