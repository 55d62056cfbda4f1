"""The lab's own error: a DeployError, so the tool's CLI reports it with its exit code."""

from __future__ import annotations

from ddtree_deploy.errors import DeployError


class LabError(DeployError):
    """The local lab (containers, namespaces) could not be brought up or down."""
