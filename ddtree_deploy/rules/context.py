"""What a rule sees: the facts, the venv under diagnosis, the deployment and the model facts."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from ddtree_deploy.config.schema import Deployment, VenvSpec
from ddtree_deploy.facts.model import Facts, Gpu, Venv
from ddtree_deploy.rules.findings import Finding
from ddtree_deploy.rules.model_fit import ModelFacts
from ddtree_deploy.rules.venv_lane import LaneReport, lane


@dataclass(frozen=True)
class RuleContext:
    facts: Facts
    venv_path: str | None = None  # the venv asked about (may be missing from the facts)
    venv: Venv | None = None
    deployment: Deployment | None = None
    model_facts: ModelFacts | None = None
    lanes: tuple[tuple[str, str], ...] = ()  # (where, lane) of everything diagnosed: driver rule
    lane_report: LaneReport | None = field(default=None)
    venv_spec: VenvSpec | None = None  # the deployment's venv as hosts.yaml declares it (role)

    @property
    def host(self) -> str:
        return self.facts.host

    @property
    def path(self) -> str:
        return self.venv_path or (self.venv.path if self.venv else "PATH")

    @property
    def dep_name(self) -> str | None:
        return self.deployment.name if self.deployment else None

    def with_venv(self, path: str | None, venv: Venv | None) -> RuleContext:
        report = lane(venv) if venv is not None and venv.exists else None
        return RuleContext(self.facts, path, venv, self.deployment, self.model_facts, self.lanes,
                           report, self.venv_spec)

    def dist(self, name: str) -> str | None:
        """The installed version of a distribution in the venv, by canonical name."""
        if self.venv is None:
            return None
        want = canonicalize_name(name)
        for key, version in self.venv.distributions.items():
            if canonicalize_name(key) == want:
                return version
        return None

    def sglang_version(self) -> str | None:
        if self.venv is None:
            return None
        info = self.venv.sglang
        return (info.version if info and info.version else None) or self.dist("sglang")

    def gpus(self) -> list[Gpu]:
        """The deployment's GPUs when it names them, else every GPU of the host."""
        all_gpus = self.facts.nvidia.gpus
        if self.deployment is not None and self.deployment.gpu_indices is not None:
            chosen = set(self.deployment.gpu_indices)
            return [g for g in all_gpus if g.index in chosen]
        return list(all_gpus)


def sm_major(gpu: Gpu) -> int | None:
    if not gpu.compute_cap:
        return None
    head = gpu.compute_cap.split(".")[0]
    return int(head) if head.isdecimal() else None


Rule = Callable[[RuleContext], Iterable[Finding]]
