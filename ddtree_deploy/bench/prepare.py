"""What a sweep needs before it starts, from hosts.yaml, the host's facts and the model folders.

The deployment's service (`service/resolve.py`: venv, GPU, port, model paths, flags) is the
base; each configuration changes only its speculative settings. The drafter's block size and
the target's vocabulary come from their config.json files on the host (the facts carry them
where the probe read them; otherwise one `cat` each). Servers started with
`--skip-tokenizer-init` get token-id prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ddtree_deploy.bench.grid import Grid
from ddtree_deploy.config.hosts import Config, Deployment, HostSpec
from ddtree_deploy.errors import UsageError
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.settings.layers import SettingsRefused
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport

SKIP_TOKENIZER = "--skip-tokenizer-init"


@dataclass(frozen=True)
class Prepared:
    deployment: Deployment | None
    base: ServiceSpec
    specs: dict[str, ServiceSpec]
    draft: str | None
    block: int | None
    vocab: int
    ids: bool


def pick_deployment(config: Config, host: HostSpec, name: str | None) -> Deployment | None:
    if name:
        dep = config.deployment(name)
        if dep.host != host.name:
            raise UsageError(f"deployment '{name}' runs on {dep.host}, not on {host.name}")
        return dep
    deps = config.deployments_on(host)
    if len(deps) == 1:
        return deps[0]
    if not deps:
        raise UsageError(f"{host.name} has no deployment in {config.path}",
                         hint="name one: ddtree-deploy bench HOST DEPLOYMENT")
    raise UsageError(f"{host.name} has several deployments ({', '.join(d.name for d in deps)})",
                     hint="name one: ddtree-deploy bench HOST DEPLOYMENT")


def model_config(t: ExecTransport, facts: Facts, path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    entry = facts.model(path)
    if entry is not None and entry.config:
        return dict(entry.config)
    r = t.run(Command.of("cat", f"{path.rstrip('/')}/config.json"), timeout=30)
    if not r.ok:
        return None
    try:
        data = json.loads(r.stdout)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def block_size(conf: dict[str, Any] | None) -> int | None:
    if not conf:
        return None
    for holder in (conf.get("dflash_config"), conf):
        if isinstance(holder, dict) and isinstance(holder.get("block_size"), int):
            return int(holder["block_size"])
    return None


def vocab_size(conf: dict[str, Any] | None) -> int | None:
    if not conf:
        return None
    for holder in (conf, conf.get("text_config")):
        if isinstance(holder, dict) and isinstance(holder.get("vocab_size"), int):
            return int(holder["vocab_size"])
    return None


def prepare(t: ExecTransport, config: Config, host: HostSpec, facts: Facts,
            dep: Deployment | None, grid: Grid, *, force: bool = False) -> Prepared:
    """`force`: share a GPU other processes hold (several small servers on one GPU)."""
    from ddtree_deploy.service.resolve import build_spec, settings_for

    base = build_spec(config, host, facts, dep, force=force)
    path = base.settings.draft_model_path  # the deployment's, else the host's 'draft' model
    draft = str(path) if path is not None else None
    block = block_size(model_config(t, facts, draft))
    if any(c.algorithm != "none" for c in grid.configs) and draft is None:
        raise UsageError(f"the grid has speculative configurations but {base.name} has no draft "
                         "model (the deployment's draft_model_path or the host's 'draft' model)")
    vocab = vocab_size(model_config(t, facts, base.model_path)) or 32000
    skip = SKIP_TOKENIZER in base.server_args()
    ids = {"ids": True, "text": False, "auto": skip}[grid.prompts]
    if skip and not ids:
        raise UsageError(f"{base.name} runs with {SKIP_TOKENIZER}: it takes token ids only",
                         hint="set prompts: ids (or auto) in the grid")
    # each configuration: a layer over the deployment's settings, checked against the
    # drafter's block (the verify width) as any deployment is
    try:
        specs = {c.key: build_spec(config, host, facts, dep,
                                   settings_for(config, host, dep, c.layer), force=force,
                                   block=block) for c in grid.configs}
    except SettingsRefused as exc:  # the grid asks what this drafter cannot serve: exit 2
        raise exc.as_input_error() from None
    return Prepared(dep, base, specs, draft, block, vocab, ids)


def host_facts(facts: Facts, base: ServiceSpec) -> dict[str, Any]:
    """The host's facts a result needs to be read later: GPU, driver, lane, versions."""
    from ddtree_deploy.rules.venv_lane import lane_from_cuda

    venv = facts.venv(base.venv)
    gpus = [g for g in facts.nvidia.gpus if g.index in base.gpus]
    torch = venv.torch if venv else None
    return {
        "host": facts.host, "hostname": facts.host_info.hostname, "os": facts.host_info.os,
        "kernel": facts.host_info.kernel, "cpu_count": facts.host_info.cpu_count,
        "gpus": [{"index": g.index, "name": g.name, "memory_total_mib": g.memory_total_mib,
                  "compute_cap": g.compute_cap} for g in gpus],
        "driver_version": facts.nvidia.driver_version, "cuda_version": facts.nvidia.cuda_version,
        "venv": base.venv, "python": venv.python_version if venv else None,
        "torch": torch.version if torch else None,
        "lane": lane_from_cuda(torch.cuda) if torch else None,
        "sglang": venv.sglang.version if venv and venv.sglang else None,
        "payload": (venv.sglang.payload.version if venv and venv.sglang and venv.sglang.payload
                    else None),
        "facts_taken_at": facts.taken_at,
    }
