"""A hosts file's layers of a server's settings: the host's default models, then a deployment.

`settings.layers.merge` puts flags (or a bench configuration) on top; each value is said at its
line of the file (``hosts.yaml:80: deployments.sglang-ddtree.ddtree.budget``).
"""

from __future__ import annotations

from typing import Any

from ddtree_deploy.config.hosts import Config
from ddtree_deploy.config.schema import Deployment, HostSpec
from ddtree_deploy.config.yamlload import PathKey
from ddtree_deploy.settings.layers import Layer, file_layer


def _model_key(where: PathKey, loc: tuple[Any, ...]) -> PathKey:
    """hosts.NAME.models.default for a host's default target, .draft for its drafter."""
    key = {"model_path": "default", "draft_model_path": "draft"}.get(str(loc[0]) if loc else "")
    return (*where, key) if key else where


def settings_layers(config: Config, host: HostSpec, deployment: Deployment | None
                    ) -> list[Layer]:
    """The host's default models (models.default, models.draft), then the deployment's fields."""
    defaults: dict[tuple[str, ...], Any] = {}
    if host.default_model is not None:
        defaults[("model_path",)] = host.default_model
    if "draft" in host.models:
        defaults[("draft_model_path",)] = host.models["draft"]
    where: PathKey = ("hosts", host.name, "models")

    def locate(loc: tuple[Any, ...]) -> str:
        at = _model_key(where, loc)
        return f"{config.path}:{config.line_of(at)}: {'.'.join(map(str, at))}"

    layers = [Layer(defaults, locate)]
    if deployment is not None:
        layers.append(file_layer(deployment.server_fields(), str(config.path),
                                 ("deployments", deployment.name), config.line_of))
    return layers
