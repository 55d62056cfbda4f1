"""Deployment rules: fire only when a deployment is given (and, for venv ones, its venv).

The deployment's own running service never makes its GPU or port "taken": processes and
listeners owned by ``<service>.service`` (or its main PID) are exempt.
"""

from __future__ import annotations

from collections.abc import Iterable

from ddtree_deploy.config.schema import Deployment
from ddtree_deploy.errors import RefusedError
from ddtree_deploy.facts.model import GpuProcess, Listener
from ddtree_deploy.rules import findings
from ddtree_deploy.rules.context import Rule, RuleContext
from ddtree_deploy.rules.deploy_endpoint import config_yaml, open_endpoint, venv_role
from ddtree_deploy.rules.findings import Finding
from ddtree_deploy.rules.floors import base_version, parse_version, sglang_wheel
from ddtree_deploy.rules.model_fit import (
    DRAFTED,
    draft_block_size,
    expected_width,
    verify_width_problem,
    verify_width_remedy,
)
from ddtree_deploy.rules.placement import choose_gpus
from ddtree_deploy.settings.model import flag_value, named_attention_backends


def _own_pids(ctx: RuleContext, dep: Deployment) -> set[int]:
    return {u.main_pid for u in ctx.facts.services.units
            if u.name == dep.unit_name and u.main_pid}  # fmt: skip


def _foreign(ctx: RuleContext, dep: Deployment, item: GpuProcess | Listener) -> bool:
    return item.unit != dep.unit_name and item.pid not in _own_pids(ctx, dep)


def _free_gpus(ctx: RuleContext, dep: Deployment) -> list[int]:
    return [g.index for g in ctx.facts.nvidia.gpus
            if not g.dead and not any(_foreign(ctx, dep, p) for p in g.processes)]  # fmt: skip


def _suggest_gpu(ctx: RuleContext, dep: Deployment) -> str:
    if dep.tp_size > 1:  # the first GPU of a free contiguous run
        try:
            return f"--gpu {choose_gpus(ctx.facts, None, dep.tp_size, own_unit=dep.unit_name)[0]}"
        except RefusedError:
            return "--gpu N"
    free = _free_gpus(ctx, dep)
    return f"--gpu {free[0]}" if free else "--gpu N"


def gpu_problems(ctx: RuleContext) -> Iterable[Finding]:
    dep = ctx.deployment
    if dep is None or dep.gpu_indices is None or not ctx.facts.nvidia.present:
        return
    gpus = {g.index: g for g in ctx.facts.nvidia.gpus}
    flag = _suggest_gpu(ctx, dep)
    remedy = findings.service_up(ctx.host, dep.name, flag) + f" (free GPUs: {_free_gpus(ctx, dep)})"
    for index in dep.gpu_indices:
        gpu = gpus.get(index)
        if gpu is None:
            yield Finding(
                id="deploy.gpu-missing", severity="error",
                message=f"deployment {dep.name} names GPU {index}, which the host does not have",
                evidence={"gpu": index, "host_gpus": sorted(gpus)}, remedy=remedy,
            )  # fmt: skip
        elif gpu.dead:
            yield Finding(
                id="deploy.gpu-dead", severity="error",
                message=f"deployment {dep.name} names GPU {index}, which is dead",
                evidence={"gpu": index, "error": gpu.error}, remedy=remedy,
            )  # fmt: skip
        else:
            others = [p for p in gpu.processes if _foreign(ctx, dep, p)]
            if others:
                yield Finding(
                    id="deploy.gpu-busy", severity="error",
                    message=f"GPU {index} is busy with another process: "
                    + ", ".join(f"{p.name or '?'} (PID {p.pid})" for p in others),
                    evidence={"gpu": index, "own_unit": dep.unit_name,
                              "processes": [p.model_dump() for p in others]},
                    remedy=remedy,
                )  # fmt: skip


def tp_gpus(ctx: RuleContext) -> Iterable[Finding]:
    """A tensor-parallel deployment without a gpu: is there a free contiguous run for it?"""
    dep = ctx.deployment
    if dep is None or dep.gpu is not None or dep.tp_size == 1 or not ctx.facts.nvidia.present:
        return

    try:
        chosen = choose_gpus(ctx.facts, None, dep.tp_size, own_unit=dep.unit_name)
    except RefusedError as exc:
        yield Finding(
            id="deploy.tp-gpus", severity="error", message=exc.message,
            evidence={"tp_size": dep.tp_size, "free_gpus": _free_gpus(ctx, dep)},
            remedy=f"{exc.hint}; set tp_size (or gpu) for deployment {dep.name} in hosts.yaml "
            f"and run {findings.apply(ctx.host, dep.name)}",
        )  # fmt: skip
        return
    yield Finding(
        id="deploy.tp-gpus", severity="info",
        message=f"tp {dep.tp_size} will run on GPUs {', '.join(map(str, chosen))} "
        "(free and contiguous)",
        evidence={"tp_size": dep.tp_size, "gpus": list(chosen)},
    )  # fmt: skip


def port_taken(ctx: RuleContext) -> Iterable[Finding]:
    dep = ctx.deployment
    if dep is None or dep.port is None:
        return
    listeners = ctx.facts.services.listeners
    others = [x for x in listeners if x.port == dep.port and _foreign(ctx, dep, x)]
    if not others:
        return
    used = {x.port for x in listeners}
    free = next((p for p in range(dep.port + 1, 65536) if p not in used), None)
    yield Finding(
        id="deploy.port-taken", severity="error",
        message=f"port {dep.port} is already taken by "
        + ", ".join(f"{x.process or '?'} (PID {x.pid}, unit {x.unit or '?'})" for x in others),
        evidence={"port": dep.port, "own_unit": dep.unit_name,
                  "listeners": [x.model_dump() for x in others]},
        remedy=findings.service_up(ctx.host, dep.name, f"--port {free or 'P'}"),
    )  # fmt: skip


def python_glibc(ctx: RuleContext) -> Iterable[Finding]:
    dep = ctx.deployment
    if dep is None:
        return
    installed = base_version(ctx.sglang_version())
    wheel = sglang_wheel(dep.sglang.version)
    if wheel is None or installed == base_version(dep.sglang.version):
        return
    python = (ctx.venv.python_version if ctx.venv else None) or ctx.facts.host_info.python
    if python and (ver := parse_version(python.split()[0])) and ver not in wheel.python:
        yield Finding(
            id="deploy.python", severity="error",
            message=f"sglang {dep.sglang.version} wheels need Python {wheel.python}; "
            f"the venv has {python}",
            evidence={"python": python, "needs": str(wheel.python), "source": wheel.source},
            remedy="give the venv a fitting Python (hosts.yaml venvs.NAME.create.python, e.g. "
            f'"3.12") and run {findings.apply(ctx.host, dep.name)}, or choose another '
            "sglang.version",
        )  # fmt: skip
    glibc = ctx.facts.host_info.glibc
    have, need = parse_version(glibc), parse_version(wheel.glibc)
    if have is not None and need is not None and have < need:
        tag = "manylinux_" + str(wheel.glibc).replace(".", "_")
        yield Finding(
            id="deploy.glibc", severity="error",
            message=f"sglang {dep.sglang.version} wheels are {tag}; the host's glibc is {glibc}",
            evidence={"glibc": glibc, "needs": wheel.glibc, "os": ctx.facts.host_info.os,
                      "source": wheel.source},
            remedy="deploy to a host with a newer OS, or set the deployment's sglang.version to "
            f"a release whose wheel fits, then {findings.apply(ctx.host, dep.name)}",
        )  # fmt: skip


def lane_mismatch(ctx: RuleContext) -> Iterable[Finding]:
    dep, report = ctx.deployment, ctx.lane_report
    if dep is None or report is None or report.lane is None or report.lane == dep.cuda_lane:
        return
    yield Finding(
        id="deploy.lane-mismatch", severity="error",
        message=f"deployment {dep.name} wants the {dep.cuda_lane} lane; venv {ctx.path} has "
        f"torch {report.lane}",
        evidence={"venv": ctx.path, "venv_lane": report.lane, "deployment_lane": dep.cuda_lane,
                  "torch": ctx.venv.torch.version if ctx.venv and ctx.venv.torch else None},
        remedy=findings.overlay(ctx.host, dep.cuda_lane, ctx.path),
    )  # fmt: skip


def sglang_version(ctx: RuleContext) -> Iterable[Finding]:
    dep = ctx.deployment
    if dep is None or ctx.venv is None:
        return
    have, want = ctx.sglang_version(), dep.sglang.version
    if have is not None and parse_version(have) == parse_version(want):
        return
    yield Finding(
        id="deploy.sglang-missing" if have is None else "deploy.sglang-version",
        severity="error",
        message=f"deployment {dep.name} wants sglang {want}; venv {ctx.path} has "
        + (f"sglang {have}" if have else "no sglang"),
        evidence={"venv": ctx.path, "installed": have, "wanted": want},
        remedy=findings.apply(ctx.host, dep.name),
    )  # fmt: skip


def no_dflash(ctx: RuleContext) -> Iterable[Finding]:
    dep, info = ctx.deployment, ctx.venv.sglang if ctx.venv else None
    if dep is None or dep.algorithm not in DRAFTED or info is None or info.dflash_modules:
        return
    yield Finding(
        id="deploy.no-dflash", severity="error",
        message=f"sglang {info.version} in {ctx.path} has no DFlash modules "
        "(speculative/dflash_worker.py); --speculative-algorithm "
        f"{dep.algorithm.upper()} cannot run",
        evidence={"venv": ctx.path, "sglang": info.version, "dflash_modules": [],
                  "algorithm": dep.algorithm},
        remedy="set the deployment's sglang.version to 0.5.11 (first with DFlash) and run "
        + findings.apply(ctx.host, dep.name),
    )  # fmt: skip


def _width(ctx: RuleContext) -> int | None:
    mf = ctx.model_facts
    if mf is None or mf.target_config is None or mf.draft_config is None:
        return None
    return expected_width(mf.target_config, mf.draft_config)


def payload_matrix(ctx: RuleContext) -> Iterable[Finding]:
    """A DDTree deployment whose declared sglang release the payload does not serve (an
    installed one that differs is deploy.sglang-version's: apply installs the declared)."""
    from ddtree_deploy.rules.matrix import shipped_matrix

    dep = ctx.deployment
    if dep is None or dep.algorithm != "ddtree" or not dep.payload:
        return
    matrix = shipped_matrix()
    version = dep.sglang.version
    if matrix.form(version) is not None:
        return
    yield Finding(
        id="payload.sglang-unsupported", severity="error",
        message=f"deployment {dep.name}: {matrix.refusal(version)}",
        evidence={"venv": ctx.path, "declared": version, "patch": list(matrix.patch),
                  "plugin": list(matrix.plugin), "refused": matrix.refused},
        remedy="set the deployment's sglang.version to a supported release in hosts.yaml "
        "and run " + findings.apply(ctx.host, dep.name),
    )  # fmt: skip


def ddtree_payload(ctx: RuleContext) -> Iterable[Finding]:
    from ddtree_deploy.rules.matrix import shipped_matrix

    dep, info = ctx.deployment, ctx.venv.sglang if ctx.venv else None
    if dep is None or dep.algorithm != "ddtree" or info is None or not info.dflash_modules:
        return
    if shipped_matrix().form(info.version) == "plugin":
        have = info.payload
        if have is None or have.form != "plugin" or not have.intact:
            yield Finding(
                id="payload.plugin-missing", severity="error",
                message=f"sglang {info.version} in {ctx.path} takes DDTree as a plugin, and "
                + ("none is installed" if have is None or have.form != "plugin" else
                   "the plugin's files were changed since it was installed"),
                evidence={"venv": ctx.path, "sglang": info.version,
                          "payload": have.model_dump() if have else None},
                remedy=findings.payload_deploy(ctx.host, ctx.path),
            )  # fmt: skip
        return
    remedy = findings.payload_deploy(ctx.host, ctx.path)
    if not dep.payload:
        remedy += " (and set payload: true for the deployment in hosts.yaml)"
    evidence = {"venv": ctx.path, "knows_ddtree": info.knows_ddtree,
                "ddtree_is_dflash": info.ddtree_is_dflash, "ddtree_modules": info.ddtree_modules,
                "spec_algorithms": info.spec_algorithms}  # fmt: skip
    if info.knows_ddtree is None and info.spec_error:
        yield Finding(
            id="payload.ddtree-unknown", severity="warning",
            message=f"could not tell whether sglang in {ctx.path} knows DDTREE: {info.spec_error}",
            evidence={**evidence, "spec_error": info.spec_error}, remedy=remedy,
        )  # fmt: skip
    elif not info.knows_ddtree:
        yield Finding(
            id="payload.ddtree-missing", severity="error",
            message=f"sglang in {ctx.path} has no DDTREE speculative algorithm",
            evidence=evidence, remedy=remedy,
        )  # fmt: skip
    elif info.ddtree_is_dflash is False:
        width = _width(ctx)
        extra = f" of width {width:,}" if width else ""
        yield Finding(
            id="payload.ddtree-not-dflash", severity="error",
            message="DDTREE is not treated as DFlash (is_dflash() is False): the draft gets one "
            f"layer's hidden states instead of the concatenated ones{extra}",
            evidence={**evidence, "expected_hidden_width": width}, remedy=remedy,
        )  # fmt: skip


def ddtree_attention(ctx: RuleContext) -> Iterable[Finding]:
    """Full-tree DDTREE verifies with the triton backend only (the payload picks triton when
    none is named); shadow-linear verifies the chain, which every DFlash backend serves."""
    dep = ctx.deployment
    if dep is None or dep.algorithm != "ddtree":
        return
    named = named_attention_backends(dep.attention_backend, dep.extra_args)
    others = {flag: value for flag, value in named.items() if value != "triton"}
    shadow = bool(dep.ddtree and dep.ddtree.shadow_linear)
    evidence = {"algorithm": dep.algorithm, "shadow_linear": shadow, "backends": named}
    if shadow:
        yield Finding(
            id="deploy.ddtree-attention", severity="info",
            message="shadow-linear DDTREE builds and scores the tree but verifies the linear "
            "chain, which runs with any attention backend ("
            + (", ".join(f"{k} {v}" for k, v in named.items()) or "none named") + ")",
            evidence=evidence,
            remedy="for full-tree verification set ddtree.shadow_linear: false with "
            "attention_backend: triton (or none) in hosts.yaml",
        )  # fmt: skip
    elif others:
        listed = ", ".join(f"{k} {v}" for k, v in others.items())
        yield Finding(
            id="deploy.ddtree-attention", severity="error",
            message="full-tree DDTREE verification runs only with the triton attention "
            f"backend; the deployment names {listed}, which the payload refuses at start",
            evidence=evidence,
            remedy=f"set attention_backend: triton (or leave it out) for deployment {dep.name} "
            f"in hosts.yaml and run {findings.apply(ctx.host, dep.name)}, or "
            + findings.service_up(ctx.host, dep.name, "--attention-backend triton")
            + "; or set ddtree.shadow_linear: true to verify the chain only",
        )  # fmt: skip


def _flag_int(args: list[str], flag: str) -> int | None:
    text = flag_value(args, flag)
    return int(text) if text is not None and text.isdecimal() else None


def ddtree_verify_width(ctx: RuleContext) -> Iterable[Finding]:
    """budget + 1 < the drafter's block size: the verify width is too narrow for the draft."""
    dep, mf = ctx.deployment, ctx.model_facts
    if dep is None or dep.algorithm != "ddtree" or dep.ddtree is None or dep.ddtree.shadow_linear:
        return
    if mf is None or mf.draft_config is None:
        return
    found = draft_block_size(mf.draft_config)
    block_flag = _flag_int(dep.extra_args, "--speculative-num-draft-tokens")
    block, source = (block_flag, "--speculative-num-draft-tokens") if block_flag else \
        found if found else (None, None)
    if block is None:
        return
    budget = dep.ddtree.budget
    if budget is None:
        return
    problem = verify_width_problem(budget, block)
    if problem is None:
        return
    width = budget + 1
    evidence: dict[str, object] = {
        "budget": budget, "verify_width": width, "block_size": block,
        "block_size_from": f"{mf.draft_path}/config.json {source}"
        if source != "--speculative-num-draft-tokens" else source,
        "kv_slots_per_request_per_round": width,
    }  # fmt: skip
    running = _flag_int(dep.extra_args, "--max-running-requests")
    graph_bs = _flag_int(dep.extra_args, "--cuda-graph-max-bs")
    if running:
        evidence["kv_slots_per_round"] = width * running
        evidence["draft_writes_per_round"] = block * running
    if graph_bs:
        evidence["cuda_graph_tokens_at_max_bs"] = width * graph_bs
    yield Finding(
        id="deploy.ddtree-verify-width", severity="error", message=problem,
        evidence=evidence, remedy=verify_width_remedy(dep.name, block),
    )  # fmt: skip


# Rules about the host's resources (run once) and about the deployment's venv (per venv).
# python_glibc runs with the deployment's venv when it exists, else with the host's Python.
DEPLOY_HOST_RULES: tuple[Rule, ...] = (gpu_problems, tp_gpus, port_taken, ddtree_attention,
                                       ddtree_verify_width, python_glibc, venv_role,
                                       open_endpoint)
DEPLOY_VENV_RULES: tuple[Rule, ...] = (lane_mismatch, sglang_version, no_dflash, payload_matrix,
                                       ddtree_payload, config_yaml)
