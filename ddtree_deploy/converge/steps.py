"""Steps of a plan: data (printable, saved as JSON), each with why it is needed and what it
changes, or why it is already satisfied."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ddtree_deploy.facts.model import Facts

KINDS = ("venv.create", "lane.overlay", "package.install", "payload.deploy", "payload.upgrade",
         "unit.install", "service.start", "service.probe", "unit.remove")


@dataclass
class Step:
    kind: str
    host: str
    deployment: str
    title: str
    reason: str
    changes: list[str] = field(default_factory=list)
    satisfied: bool = False
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        """A change to make (a probe is a check, never a change)."""
        return not self.satisfied and self.kind != "service.probe"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan:
    hosts: list[str]
    steps: list[Step]
    fingerprints: dict[str, str]  # host -> facts fingerprint the plan was made from
    made_at: float = 0.0

    @property
    def changes(self) -> list[Step]:
        return [s for s in self.steps if s.pending]

    def as_json(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "fingerprints": self.fingerprints, "made_at": self.made_at,
                "changes": len(self.changes), "steps": [s.as_json() for s in self.steps]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(hosts=list(data["hosts"]), fingerprints=dict(data["fingerprints"]),
                   made_at=float(data.get("made_at", 0.0)),
                   steps=[Step(**s) for s in data["steps"]])


def fingerprint(facts: Facts, venvs: list[str], units: dict[str, str | None]) -> str:
    """What a plan depends on: the deployments' venvs (distributions, torch, sglang's DDTree
    state), the installed unit texts and which GPUs are dead. Timings, PIDs and memory
    figures are left out, so a plan stays valid while nothing it relies on changes."""
    doc: dict[str, Any] = {"venvs": {}, "units": units,
                           "dead": sorted(g.index for g in facts.nvidia.gpus if g.dead)}
    for path in venvs:
        v = facts.venv(path)
        doc["venvs"][path] = None if v is None or not v.exists else {
            "dists": v.distributions,
            "torch": v.torch.model_dump() if v.torch else None,
            "ddtree": [v.sglang.knows_ddtree, v.sglang.ddtree_is_dflash] if v.sglang else None,
            "payload": v.sglang.payload.model_dump() if v.sglang and v.sglang.payload else None,
        }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
