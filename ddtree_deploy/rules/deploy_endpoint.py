"""Deployment rules about where and how a service may run: its venv's role (nothing is written
into a source or training venv), an endpoint open to every interface without an API key, and
the PyYAML SGLang needs to read its key from a --config file."""

from __future__ import annotations

from collections.abc import Iterable

from ddtree_deploy.rules import findings
from ddtree_deploy.rules.context import RuleContext
from ddtree_deploy.rules.findings import Finding


def venv_role(ctx: RuleContext) -> Iterable[Finding]:
    """A deployment served from a source or training venv: apply will not write into it."""
    dep, spec = ctx.deployment, ctx.venv_spec
    if dep is None or spec is None or not spec.protected:
        return
    path = str(spec.path)
    yield Finding(
        id="deploy.venv-role", severity="warning",
        message=f"deployment {dep.name} runs from venv {path}, whose role is {spec.role}: plan "
        "and apply refuse to write into it (packages, CUDA lane, payload, a clone into it); "
        "running a service from it stays allowed",
        evidence={"venv": path, "role": spec.role, "deployment": dep.name},
        remedy=f"serve from a venv of role serving cloned from it (hosts.yaml: a venv with "
        f"create: {{clone: {dep.venv}}}, named in deployments.{dep.name}.venv), then "
        f"{findings.apply(dep.host)}; or set venvs.{dep.venv}.allow_writes: true for host "
        f"{dep.host} to let the tool change it",
    )  # fmt: skip


def config_yaml(ctx: RuleContext) -> Iterable[Finding]:
    """An API key goes to SGLang through --config FILE, which SGLang reads with PyYAML
    (sglang/srt/server_args_config_parser.py imports yaml; transformers usually brings it)."""
    dep = ctx.deployment
    if dep is None or dep.api_key_file is None or ctx.venv is None or ctx.dist("pyyaml"):
        return
    yield Finding(
        id="deploy.config-needs-yaml", severity="error",
        message=f"deployment {dep.name} gives SGLang its API key in a --config file, which "
        f"SGLang reads with PyYAML, and venv {ctx.path} has no pyyaml",
        evidence={"venv": ctx.path, "pyyaml": None},
        remedy=findings.install(ctx.host, "pyyaml", dep.name),
    )  # fmt: skip


def open_endpoint(ctx: RuleContext) -> Iterable[Finding]:
    """The server listens on every interface and asks no API key: anyone who reaches it."""
    dep = ctx.deployment
    if dep is None or dep.api_key_file is not None:
        return
    bind = dep.bind or "0.0.0.0"
    if bind not in ("0.0.0.0", "::", "[::]"):
        return
    yield Finding(
        id="deploy.open-endpoint", severity="warning",
        message=f"deployment {dep.name} listens on {bind} (every interface) without an API "
        "key: anyone who can reach the port can use the model",
        evidence={"bind": bind, "port": dep.port, "api_key_file": None},
        remedy=f"set deployments.{dep.name}.api_key_file (a file on this workstation holding "
        f"the key: it goes into a 0600 file SGLang reads with --config), or bind: 127.0.0.1 "
        f"for local clients only; then {findings.apply(dep.host)}",
    )  # fmt: skip
