"""Host and venv rules: small pure functions RuleContext -> findings.

Venv rules judge a venv against what the sglang installed in it needs; where a deployment
targets the venv, its choices (attention and grammar backends) set how bad a problem is.
"""

from __future__ import annotations

from collections.abc import Iterable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ddtree_deploy.rules import findings
from ddtree_deploy.rules.context import Rule, RuleContext, sm_major
from ddtree_deploy.rules.findings import Finding, Severity
from ddtree_deploy.rules.floors import (
    BLACKWELL_MAJORS,
    DRIVER_FLOORS,
    FLASHINFER_JIT,
    KERNEL_DISTRIBUTIONS,
    KERNEL_TORCH_PINS,
    MM_MXFP8,
    SGLANG_PINS,
    SOUNDFILE,
    NameFloor,
    base_version,
    parse_version,
    sglang_needs,
)
from ddtree_deploy.rules.venv_lane import lane_major


def _int_head(text: str | None) -> int | None:
    head = (text or "").split(".")[0].strip()
    return int(head) if head.isdecimal() else None


def _cuda_tuple(text: str | None) -> tuple[int, int] | None:
    parts = (text or "").strip().split(".")
    if len(parts) < 2 or not parts[0].isdecimal() or not parts[1].isdecimal():
        return None
    return int(parts[0]), int(parts[1])


def has_name(ctx: RuleContext, floor: NameFloor) -> bool | None:
    """Whether the venv's package defines the name: read names first, else the version floor."""
    if ctx.venv is None:
        return None
    names = ctx.venv.names.get(floor.module)
    if names is not None:
        return floor.name in names
    version = parse_version(ctx.dist(floor.distribution))
    return None if version is None else version >= Version(floor.first)


# ---- host


def _live_gpu(ctx: RuleContext, dead: int) -> str:
    """Move a service to a live GPU no process holds, named when there is one."""
    free = [g.index for g in ctx.facts.nvidia.gpus if not g.dead and not g.processes]
    if not free:
        return f"no GPU is free now ({findings.inventory(ctx.host)} shows who holds them)"
    return (f"move a service that uses it to a live, free one: "
            f"{findings.service_up(ctx.host, ctx.dep_name, f'--gpu {free[0]}')}")


def gpu_dead(ctx: RuleContext) -> Iterable[Finding]:
    for gpu in ctx.facts.nvidia.gpus:
        if gpu.dead:
            yield Finding(
                id="gpu.dead", severity="warning",
                message=f"GPU {gpu.index} ({gpu.name or 'unknown'}) is dead: "
                f"{gpu.error or 'no answer'}",
                evidence={"index": gpu.index, "name": gpu.name, "pci_bus_id": gpu.pci_bus_id,
                          "error": gpu.error, "memory_used_mib": gpu.memory_used_mib},
                remedy=f"keep services off GPU {gpu.index}: {_live_gpu(ctx, gpu.index)}; the card "
                "needs a reboot or reseat",
            )  # fmt: skip


def nvidia_absent(ctx: RuleContext) -> Iterable[Finding]:
    nv = ctx.facts.nvidia
    if not nv.present:
        yield Finding(
            id="nvidia.absent",
            severity="warning",
            message="the GPU driver did not answer (NVML, nvidia-smi): no GPU seen on this host",
            evidence={"error": nv.error},
            remedy="install or load the NVIDIA driver (R580+ for the cu130 lane), then "
            f"{findings.doctor(ctx.host)} again",
        )


def driver_too_old(ctx: RuleContext) -> Iterable[Finding]:
    nv = ctx.facts.nvidia
    driver = _int_head(nv.driver_version)
    if driver is None:
        return
    by_lane: dict[str, list[str]] = {}
    for where, lane in ctx.lanes:
        by_lane.setdefault(lane, []).append(where)
    for lane, wheres in sorted(by_lane.items()):
        major = lane_major(lane)
        floor = DRIVER_FLOORS.get(major) if major is not None else None
        if floor is None or driver >= floor.driver_major:
            continue
        also = f", or stay on cu128 ({findings.overlay(ctx.host, 'cu128', ctx.path)})"
        yield Finding(
            id="driver.too-old", severity="error",
            message=f"driver {nv.driver_version} is too old for the {lane} lane "
            f"(needs R{floor.driver_major} or newer)",
            evidence={"driver_version": nv.driver_version, "driver_cuda": nv.cuda_version,
                      "lane": lane, "needed_by": sorted(set(wheres)),
                      "min_driver": floor.driver_major, "source": floor.source},
            remedy=f"upgrade the NVIDIA driver to R{floor.driver_major}+"
            + (also if major == 13 else ""),
        )  # fmt: skip


def units_unreadable(ctx: RuleContext) -> Iterable[Finding]:
    """systemd did not answer (or the tool's unit folder could not be read): what the units
    and services look like is unknown, never "none"."""
    for part, what in ((ctx.facts.services, "the host's services (systemctl, listeners)"),
                       (ctx.facts.tool, "the tool's own units and pending restarts")):
        if part.error:
            yield Finding(
                id="host.units-unreadable", severity="warning",
                message=f"{what} could not be read: {part.error}; services and the units "
                "holding GPUs and ports are unknown, not absent",
                evidence={"error": part.error},
                remedy=f"check systemd on {ctx.host} (`systemctl status` there); without "
                "systemd, run services in plain mode; then "
                + findings.doctor(ctx.host, "--refresh"),
            )  # fmt: skip


HOST_RULES: tuple[Rule, ...] = (gpu_dead, nvidia_absent, driver_too_old, units_unreadable)


# ---- venv


def venv_unreadable(ctx: RuleContext) -> Iterable[Finding]:
    if ctx.venv is not None and ctx.venv.error:
        yield Finding(
            id="venv.unreadable",
            severity="warning",
            message=f"part of venv {ctx.path} could not be read; rules may miss problems",
            evidence={"venv": ctx.path, "error": ctx.venv.error},
            remedy=f"check the path and permissions; "
            f"{findings.doctor(ctx.host, '--venv', ctx.path)} again",
        )


def lane_mix(ctx: RuleContext) -> Iterable[Finding]:
    report = ctx.lane_report
    if report is None or not report.mixed:
        return
    target = (
        ctx.deployment.cuda_lane
        if ctx.deployment
        else ("cu130" if 13 in report.majors else report.lane or "cu130")
    )
    yield Finding(
        id="venv.lane-mix", severity="error",
        message=f"venv {ctx.path} mixes CUDA majors {sorted(report.majors)}: torch is "
        f"{report.lane or 'not a CUDA build'} but compiled extensions need other CUDA libraries",
        evidence={"venv": ctx.path, "torch_lane": report.lane, "majors": sorted(report.majors),
                  "files": report.evidence},
        remedy=findings.overlay(ctx.host, target, ctx.path),
    )  # fmt: skip


def kernel_torch(ctx: RuleContext) -> Iterable[Finding]:
    for dist in KERNEL_DISTRIBUTIONS:
        version = ctx.dist(dist)
        pin = KERNEL_TORCH_PINS.get((dist, version or ""))
        if pin is None:
            continue
        torch = ctx.venv.torch if ctx.venv else None
        raw = (torch.dist_version or torch.version) if torch else ctx.dist("torch")
        installed = base_version(raw) if raw else None
        if installed == pin.torch:
            continue
        severity: Severity = "error" if pin.declared else "warning"
        lane = (
            ctx.deployment.cuda_lane
            if ctx.deployment
            else (ctx.lane_report.lane if ctx.lane_report and ctx.lane_report.lane else "cu130")
        )
        yield Finding(
            id="venv.kernel-torch", severity=severity,
            message=f"{dist} {version} is built for torch {pin.torch}, but the venv has "
            f"torch {raw or '(none)'}: its C++ symbols will not resolve",
            evidence={"venv": ctx.path, "kernel": f"{dist}=={version}", "torch": raw,
                      "kernel_needs_torch": pin.torch, "source": pin.source},
            remedy=f"{findings.overlay(ctx.host, lane, ctx.path)} installs torch {pin.torch} for "
            "the lane; or " + findings.install(ctx.host, f"torch=={pin.torch}", ctx.dep_name),
        )  # fmt: skip


def _allowed_by_deployment(ctx: RuleContext, name: str, installed: str | None) -> bool:
    if ctx.deployment is None or installed is None:
        return False
    for text in ctx.deployment.sglang.extra_packages:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == canonicalize_name(name):
            return req.specifier.contains(installed, prereleases=True)
    return False


def pin_drift(ctx: RuleContext) -> Iterable[Finding]:
    sglang = base_version(ctx.sglang_version())
    pins = SGLANG_PINS.get(sglang or "")
    if pins is None:
        return
    drift: dict[str, dict[str, str | None]] = {}
    for name, pinned in pins.as_requirements().items():
        installed = ctx.dist(name)
        have = base_version(installed) if name == "torch" else installed
        if have == pinned or _allowed_by_deployment(ctx, name, installed):
            continue
        drift[name] = {"pinned": pinned, "installed": installed}
    if drift:
        yield Finding(
            id="venv.pin-drift", severity="warning",
            message=f"venv {ctx.path} differs from what sglang {sglang} pins: "
            + ", ".join(f"{n} {d['installed'] or 'missing'} (pin {d['pinned']})"
                        for n, d in sorted(drift.items())),
            evidence={"venv": ctx.path, "sglang": sglang, "drift": drift, "source": pins.source},
            remedy=f"{findings.apply(ctx.host, ctx.dep_name)} installs sglang's pins "
            "(uv pip install 'sglang==VERSION' resolves them)",
        )  # fmt: skip


def soundfile_missing(ctx: RuleContext) -> Iterable[Finding]:
    sglang = ctx.sglang_version()
    if sglang and ctx.dist(SOUNDFILE) is None:
        yield Finding(
            id="venv.soundfile-missing",
            severity="error",
            message=f"sglang {sglang} is installed without soundfile; the HTTP server imports it",
            evidence={"venv": ctx.path, "sglang": sglang, "soundfile": None},
            remedy=findings.install(ctx.host, "soundfile==0.13.1", ctx.dep_name),
        )


def flashinfer_mxfp8(ctx: RuleContext) -> Iterable[Finding]:
    sglang = ctx.sglang_version()
    needs = sglang_needs(sglang)
    flashinfer = ctx.dist(MM_MXFP8.distribution)
    if needs is None or not needs.mxfp8_on_blackwell or flashinfer is None:
        return
    if has_name(ctx, MM_MXFP8) is not False:
        return
    majors = {m for m in (sm_major(g) for g in ctx.gpus()) if m is not None}
    torch_cuda = _cuda_tuple(ctx.venv.torch.cuda if ctx.venv and ctx.venv.torch else None)
    too_old = torch_cuda is not None and torch_cuda < (12, 8)
    if majors and (not majors & BLACKWELL_MAJORS or too_old):
        return  # sglang only imports mm_mxfp8 on SM 10-12 with CUDA >= 12.8
    yield Finding(
        id="venv.flashinfer-mxfp8", severity="error" if majors else "warning",
        message=f"flashinfer-python {flashinfer} has no mm_mxfp8 (first in {MM_MXFP8.first}); "
        f"sglang {sglang} imports it on Blackwell GPUs and fails to start",
        evidence={"venv": ctx.path, "flashinfer-python": flashinfer, "sglang": sglang,
                  "sm_majors": sorted(majors), "source": MM_MXFP8.source},
        remedy=findings.install(ctx.host, f"flashinfer-python>={MM_MXFP8.first}", ctx.dep_name),
    )  # fmt: skip


def _backend_severity(chosen: str | None, bad: str, *, default_is_bad: bool) -> Severity:
    """Error when the backend is chosen (or is sglang's default); info when another one is."""
    if chosen == bad or (chosen is None and default_is_bad):
        return "error"
    return "warning" if chosen is None else "info"


def _unused_note(severity: Severity, flag: str) -> str:
    return f" (not in the way: the deployment sets {flag})" if severity == "info" else ""


def xgrammar_structural_tag(ctx: RuleContext) -> Iterable[Finding]:
    sglang = ctx.sglang_version()
    needs = sglang_needs(sglang)
    if needs is None or needs.grammar is None or has_name(ctx, needs.grammar) is True:
        return
    floor, dep = needs.grammar, ctx.deployment
    chosen = dep.grammar_backend if dep else None
    severity = _backend_severity(chosen, "xgrammar", default_is_bad=True)
    yield Finding(
        id="venv.xgrammar-structural-tag", severity=severity,
        message=f"xgrammar {ctx.dist('xgrammar') or '(missing)'} has no {floor.name} (first in "
        f"{floor.first}); sglang {sglang}'s xgrammar backend fails to import it"
        + _unused_note(severity, f"--grammar-backend {chosen}"),
        evidence={"venv": ctx.path, "xgrammar": ctx.dist("xgrammar"), "sglang": sglang,
                  "needs": floor.name, "grammar_backend": chosen, "source": floor.source},
        remedy=findings.service_up(ctx.host, ctx.dep_name, "--grammar-backend none")
        + "; or " + findings.install(ctx.host, f"xgrammar>={floor.first}", ctx.dep_name),
    )  # fmt: skip


def flashinfer_sm12(ctx: RuleContext) -> Iterable[Finding]:
    if ctx.venv is None or ctx.dist(MM_MXFP8.distribution) is None:
        return
    sm12 = [g.index for g in ctx.gpus() if sm_major(g) == FLASHINFER_JIT.sm_major]
    if not sm12:
        return
    services, torch = ctx.facts.services, ctx.venv.torch
    cuda = services.nvcc_version if services.nvcc else (torch.cuda if torch else None)
    found = _cuda_tuple(cuda)
    if found is not None and found >= _cuda_tuple(FLASHINFER_JIT.min_cuda):  # type: ignore[operator]
        return
    dep = ctx.deployment
    chosen = dep.attention_backend if dep else None
    severity = _backend_severity(chosen, "flashinfer", default_is_bad=False)
    yield Finding(
        id="venv.flashinfer-sm12", severity=severity,
        message=f"FlashInfer's JIT refuses SM 12.x with CUDA {cuda or 'unknown'} (needs "
        f">= {FLASHINFER_JIT.min_cuda}) on GPUs {sm12}"
        + _unused_note(severity, f"--attention-backend {chosen}"),
        evidence={"venv": ctx.path, "gpus": sm12, "nvcc": services.nvcc,
                  "nvcc_version": services.nvcc_version,
                  "torch_cuda": torch.cuda if torch else None,
                  "attention_backend": chosen, "source": FLASHINFER_JIT.source},
        remedy=findings.service_up(ctx.host, ctx.dep_name, "--attention-backend triton"),
    )  # fmt: skip


VENV_RULES: tuple[Rule, ...] = (
    venv_unreadable, lane_mix, kernel_torch, pin_drift, soundfile_missing, flashinfer_mxfp8,
    xgrammar_structural_tag, flashinfer_sm12,
)  # fmt: skip
