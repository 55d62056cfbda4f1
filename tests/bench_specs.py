"""The bench's services for tests that run a sweep without hosts.yaml: a base service and, for
each configuration of a grid, the base's settings with the configuration's layer on top (the
merge the bench's prepare does over a deployment; ServerSettings validates each)."""

from __future__ import annotations

from dataclasses import replace

from ddtree_deploy.bench.grid import Grid
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.settings.layers import Layer, merge
from ddtree_deploy.settings.model import ServerSettings


def base_spec(*, name: str, host: str, venv: str, port: int, model_path: str,
              gpus: tuple[int, ...] = (0,), deployment: str | None = None,
              extra_args: tuple[str, ...] = (),
              environment: dict[str, str] | None = None) -> ServiceSpec:
    settings = ServerSettings.model_validate({"model_path": model_path,
                                              "extra_args": list(extra_args),
                                              "environment": environment or {}})
    return ServiceSpec(name=name, host=host, venv=venv, gpus=gpus, port=port,
                       settings=settings, deployment=deployment)


def specs_for(base: ServiceSpec, grid: Grid, draft: str, block: int = 16
              ) -> dict[str, ServiceSpec]:
    below = Layer({**base.settings.server_fields(), ("draft_model_path",): draft},
                  lambda loc: "the base service")
    return {c.key: replace(base, settings=merge(below, c.layer).settings, num_draft_tokens=block)
            for c in grid.configs}
