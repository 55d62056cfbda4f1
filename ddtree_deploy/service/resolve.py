"""From a deployment (or flags) and a host's facts to a ServiceSpec: pure functions.

The server's settings come from ONE merge (settings.layers: the host's default models, the
deployment, then flags), validated before any host is contacted; here the facts decide the
rest: the GPUs and port (rules.placement), the drafter's block size, the venv's library
folders and SGLang version, and the rules that need them (the verify width, tp vs the GPUs
present) run with the facts as the validation context. `build_spec` is the only
constructor of a ServiceSpec in the tool.
"""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from ddtree_deploy.config.hosts import Config, Deployment, HostSpec
from ddtree_deploy.config.layers import settings_layers
from ddtree_deploy.config.schema import UnitStem
from ddtree_deploy.errors import RefusedError, UsageError
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.rules.findings import apply, venv_clone
from ddtree_deploy.rules.model_fit import draft_block_size
from ddtree_deploy.rules.placement import FIRST_PORT, choose_gpu, choose_gpus, choose_port
from ddtree_deploy.service.endpoint import DEFAULT_BIND
from ddtree_deploy.service.libpath import ld_library_path as from_venv
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.settings.layers import Layer, Merged, merge
from ddtree_deploy.settings.messages import english
from ddtree_deploy.settings.model import DFLASH_BLOCK, HostFit, ServerSettings
from ddtree_deploy.settings.values import RemotePath

__all__ = ["FIRST_PORT", "build_spec", "check_service_flags", "choose_gpu", "choose_gpus",
           "choose_port", "draft_block", "ld_library_path", "settings_for"]


def ld_library_path(facts: Facts, venv: str) -> tuple[str, ...]:
    found = facts.venv(venv)
    if found is None or not found.exists:
        raise RefusedError(f"venv {venv} does not exist on {facts.host}",
                           hint="create it first: " + venv_clone(facts.host, "SOURCE", venv)
                                + " (SOURCE: a venv of the host to copy), or declare it with "
                                "`create:` in hosts.yaml and run " + apply(facts.host))
    return from_venv(found)


def draft_block(facts: Facts, draft: str | None) -> int:
    """The drafter's block size from its config.json in the facts, else the b16 default."""
    entry = facts.model(draft) if draft else None
    found = draft_block_size(entry.config) if entry is not None and entry.config else None
    return found[0] if found else DFLASH_BLOCK


def settings_for(config: Config, host: HostSpec, deployment: Deployment | None,
                 *flags: Layer) -> Merged:
    """The server's settings: the host's default models, the deployment, then `flags`
    (each a layer), merged and validated (exit 2 on bad input; no host contacted)."""
    return merge(*settings_layers(config, host, deployment), *flags)


def check_service_flags(deployment: Deployment | None, *, name: str | None,
                        venv: str | None) -> None:
    """`service up`'s --name and --venv, checked as hosts.yaml checks a deployment's service
    and venv path, before any host is contacted (exit 2)."""
    if venv is None and deployment is None:
        raise UsageError("--venv PATH is needed without a deployment")
    for flag, value, kind in (("--name", name, UnitStem), ("--venv", venv, RemotePath)):
        if value is None:
            continue
        try:
            TypeAdapter(kind).validate_python(value, strict=True)
        except ValidationError as exc:
            raise UsageError(f"{flag}: {english(exc.errors()[0], ServerSettings)}") from None


def _exists(facts: Facts, venv: str) -> bool:
    found = facts.venv(venv)
    return found is not None and found.exists


def build_spec(
    config: Config,
    host: HostSpec,
    facts: Facts,
    deployment: Deployment | None,
    settings: Merged | None = None,
    *,
    name: str | None = None,
    venv: str | None = None,
    force: bool = False,
    require_venv: bool = True,
    block: int | None = None,
) -> ServiceSpec:
    """The service to install: `settings` (default: the deployment's, merged) on this host.
    `name` and `venv` are `service up`'s --name and --venv (a deployment names its own);
    `block`: the drafter's block size when the caller read it (else from the facts)."""
    d = deployment
    merged = settings if settings is not None else settings_for(config, host, d)
    s = merged.settings
    name = name or (d.service_name if d else f"sglang-{s.algorithm}")
    own_unit = f"{name}.service"
    venv = venv or (str(host.venvs[d.venv].path) if d else None)
    if venv is None:
        raise UsageError("--venv PATH is needed without a deployment")
    if s.algorithm == "none":
        block = None
    elif block is None:
        block = draft_block(facts, s.draft)
    present = facts.nvidia.gpus if facts.nvidia.present else None
    s = merged.on_host(HostFit(host=host.name, draft_block=block,
                               gpu_count=len(present) if present else None,
                               deployment=d.name if d else None))
    found = facts.venv(venv)
    version = d.sglang.version if d else (
        found.sglang.version if found is not None and found.sglang is not None else None)
    return ServiceSpec(
        name=name,
        host=host.name,
        deployment=d.name if d else None,
        venv=venv,
        gpus=choose_gpus(facts, s.gpu, s.tp_size, own_unit=own_unit, force=force),
        port=choose_port(facts, s.port, own_unit=own_unit, force=force),
        settings=s,
        sglang_version=version,
        num_draft_tokens=block,
        ld_library_path=ld_library_path(facts, venv) if require_venv or _exists(facts, venv)
        else (),
        bind_host=(d.bind if d and d.bind else DEFAULT_BIND),
        user=d.user if d else None,
        secrets=tuple(k for k, path in (("api_key", d.api_key_file),
                                        ("hf_token", d.hf_token_file)) if path) if d else (),
    )
