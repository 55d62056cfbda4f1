"""Deployment rules: fire only when a deployment is given (and, for venv ones, its venv).

The deployment's own running service never makes its GPU or port "taken": processes and
listeners owned by ``<service>.service`` (or its main PID) are exempt.
"""

from __future__ import annotations

from collections.abc import Iterable

from ddtree_deploy.config_schema import Deployment
from ddtree_deploy.facts.model import GpuProcess, Listener
from ddtree_deploy.rules import findings as fx
from ddtree_deploy.rules.context import Ctx, Rule
from ddtree_deploy.rules.findings import Finding
from ddtree_deploy.rules.floors import base_version, parse_version, sglang_wheel
from ddtree_deploy.rules.model_fit import DRAFTED, expected_width


def _own_pids(ctx: Ctx, dep: Deployment) -> set[int]:
    return {u.main_pid for u in ctx.facts.services.units
            if u.name == dep.unit_name and u.main_pid}  # fmt: skip


def _foreign(ctx: Ctx, dep: Deployment, item: GpuProcess | Listener) -> bool:
    return item.unit != dep.unit_name and item.pid not in _own_pids(ctx, dep)


def _free_gpus(ctx: Ctx, dep: Deployment) -> list[int]:
    return [g.index for g in ctx.facts.nvidia.gpus
            if not g.dead and not any(_foreign(ctx, dep, p) for p in g.processes)]  # fmt: skip


def _suggest_gpu(ctx: Ctx, dep: Deployment) -> str:
    free = _free_gpus(ctx, dep)
    return f"--gpu {free[0]}" if free else "--gpu N"


def gpu_problems(ctx: Ctx) -> Iterable[Finding]:
    dep = ctx.deployment
    if dep is None or dep.gpu_indices is None or not ctx.facts.nvidia.present:
        return
    gpus = {g.index: g for g in ctx.facts.nvidia.gpus}
    flag = _suggest_gpu(ctx, dep)
    remedy = fx.service_up(ctx.host, dep.name, flag) + f" (free GPUs: {_free_gpus(ctx, dep)})"
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


def port_taken(ctx: Ctx) -> Iterable[Finding]:
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
        remedy=fx.service_up(ctx.host, dep.name, f"--port {free or 'P'}"),
    )  # fmt: skip


def python_glibc(ctx: Ctx) -> Iterable[Finding]:
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
            f'"3.12") and run {fx.apply(ctx.host, dep.name)}, or choose another sglang.version',
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
            f"a release whose wheel fits, then {fx.apply(ctx.host, dep.name)}",
        )  # fmt: skip


def lane_mismatch(ctx: Ctx) -> Iterable[Finding]:
    dep, report = ctx.deployment, ctx.lane_report
    if dep is None or report is None or report.lane is None or report.lane == dep.cuda_lane:
        return
    yield Finding(
        id="deploy.lane-mismatch", severity="error",
        message=f"deployment {dep.name} wants the {dep.cuda_lane} lane; venv {ctx.path} has "
        f"torch {report.lane}",
        evidence={"venv": ctx.path, "venv_lane": report.lane, "deployment_lane": dep.cuda_lane,
                  "torch": ctx.venv.torch.version if ctx.venv and ctx.venv.torch else None},
        remedy=fx.overlay(ctx.host, dep.cuda_lane, ctx.path),
    )  # fmt: skip


def sglang_version(ctx: Ctx) -> Iterable[Finding]:
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
        remedy=fx.apply(ctx.host, dep.name),
    )  # fmt: skip


def no_dflash(ctx: Ctx) -> Iterable[Finding]:
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
        + fx.apply(ctx.host, dep.name),
    )  # fmt: skip


def _width(ctx: Ctx) -> int | None:
    mf = ctx.model_facts
    if mf is None or mf.target_config is None or mf.draft_config is None:
        return None
    return expected_width(mf.target_config, mf.draft_config)


def ddtree_payload(ctx: Ctx) -> Iterable[Finding]:
    dep, info = ctx.deployment, ctx.venv.sglang if ctx.venv else None
    if dep is None or dep.algorithm != "ddtree" or info is None or not info.dflash_modules:
        return
    remedy = fx.payload_deploy(ctx.host, ctx.path)
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


def ddtree_attention(ctx: Ctx) -> Iterable[Finding]:
    dep = ctx.deployment
    if dep is None or dep.algorithm != "ddtree" or dep.attention_backend == "triton":
        return
    yield Finding(
        id="deploy.ddtree-attention", severity="warning",
        message="DDTree's full-tree verify runs only with the triton attention backend; "
        f"the deployment sets {dep.attention_backend or 'none (sglang chooses)'}",
        evidence={"algorithm": dep.algorithm, "attention_backend": dep.attention_backend},
        remedy=fx.service_up(ctx.host, dep.name, "--attention-backend triton"),
    )  # fmt: skip


# Rules about the host's resources (run once) and about the deployment's venv (per venv).
# python_glibc runs with the deployment's venv when it exists, else with the host's Python.
DEPLOY_HOST_RULES: tuple[Rule, ...] = (gpu_problems, port_taken, ddtree_attention, python_glibc)
DEPLOY_VENV_RULES: tuple[Rule, ...] = (lane_mismatch, sglang_version, no_dflash, ddtree_payload)
