"""Known SGLang start-up crash signatures: DATA, one entry per failure the story met.

Each signature has a stable id, a regular expression matched against ONE log line, the
diagnosis, a remedy naming the ddtree-deploy command or flag that fixes it, and where the
text comes from (the upstream file that raises it, or the real failure that prints it).
``fatal`` signatures give a verdict at once; the others (warnings) only explain a failure.

Remedies are templates: ``{host}``, ``{name}`` (the service), ``{venv}``, ``{port}``,
``{deployment}`` and ``{lane}`` (cu130 / cu128, from the missing library's major) are filled
from what the probe knows; an unknown value shows as an upper-case placeholder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from ddtree_deploy.rules import findings as remedies

TOOL = "ddtree-deploy"
_LANES = {"13": "cu130", "12": "cu128"}


@dataclass(frozen=True)
class Signature:
    id: str
    pattern: str
    diagnosis: str
    remedy: str
    source: str
    fatal: bool = True
    ignore_case: bool = False

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern, re.IGNORECASE if self.ignore_case else 0)


@dataclass(frozen=True)
class Match:
    """A signature found in a log line, its remedy filled in."""

    id: str
    line: str
    diagnosis: str
    remedy: str
    fatal: bool = True
    groups: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "line": self.line, "diagnosis": self.diagnosis,
                "remedy": self.remedy, "commands": remedies.commands_of(self.remedy),
                "fatal": self.fatal}


def _service_up(*flags: str) -> str:
    return remedies.service_up("{host}", "{deployment}", *flags)


_APPLY = remedies.apply("{host}")
_PAYLOAD = remedies.payload_deploy("{host}", "{venv}")
_OVERLAY = remedies.overlay("{host}", "{lane}", "{venv}")
_INVENTORY = remedies.inventory("{host}")
_DOCTOR = remedies.doctor("{host}")

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        id="ddtree-unknown-algorithm",
        pattern=r"invalid choice: '?DDTREE'?|Unknown speculative algorithm name: DDTREE\b",
        diagnosis="this sglang does not know the DDTREE speculative algorithm: the DDTree "
        "payload is missing or only half applied",
        remedy=_PAYLOAD,
        source="argparse's 'invalid choice' for --speculative-algorithm "
        "(sglang/srt/server_args.py choices) and sglang 0.5.11 "
        "sglang/srt/speculative/spec_info.py: raise ValueError(f\"Unknown speculative "
        "algorithm name: {name}\")",
    ),
    Signature(
        id="ddtree-flags-unknown",
        pattern=r"unrecognized arguments:.*--speculative-ddtree-",
        diagnosis="this sglang does not accept the --speculative-ddtree-* flags: the DDTree "
        "payload is not deployed in the venv",
        remedy=_PAYLOAD,
        source="argparse's 'unrecognized arguments' (sglang/srt/server_args.py lacks the flags)",
    ),
    Signature(
        id="dflash-unknown-algorithm",
        pattern=r"invalid choice: '?DFLASH'?|Unknown speculative algorithm name: DFLASH\b",
        diagnosis="this sglang predates DFlash (first in 0.5.11)",
        remedy=f"set the deployment's sglang.version to 0.5.11 and run {_APPLY}",
        source="argparse's 'invalid choice' for --speculative-algorithm in sglang 0.5.10 "
        "(sglang/srt/server_args.py choices lack DFLASH)",
    ),
    Signature(
        id="ddtree-attention-backend",
        pattern=r"DDTREE full-tree verification needs the triton attention backend, got "
        r"attention_backend=(?P<backend>[A-Za-z0-9_]+)",
        diagnosis="DDTREE's full-tree verification runs only on the triton attention backend; "
        "the service names another one, or names none and SGLang filled in its default (fa3 on "
        "Hopper, flashinfer elsewhere) before the payload's check",
        remedy=f"{_service_up('--attention-backend triton')} (or set the deployment's "
        "attention_backend: triton)",
        source="the DDTree payload's ddtree_args.py resolve_ddtree_server_args (ValueError); "
        "real on an H200 with sglang 0.5.11 (tests/data/real/sglang-0.5.11-h200/d1-no-backend.log)",
    ),
    Signature(
        id="soundfile-missing",
        pattern=r"No module named '?soundfile'?",
        diagnosis="soundfile is not installed in the venv; sglang's HTTP server imports it at "
        "start-up",
        remedy="add 'soundfile==0.13.1' to the deployment's sglang.extra_packages and run "
        f"{_APPLY}",
        source="Python's ModuleNotFoundError for `import soundfile` (sglang 0.5.11 "
        "sglang/srt/entrypoints/openai/streaming_asr.py imports it at module top)",
    ),
    Signature(
        id="xgrammar-no-structural-tag",
        pattern=r"cannot import name '?StructuralTag'? from '?xgrammar",
        diagnosis="xgrammar is older than 0.1.25 and has no StructuralTag, which sglang's "
        "xgrammar grammar backend imports",
        remedy=f"{_service_up('--grammar-backend none')}, or add 'xgrammar==0.1.32' to the "
        f"deployment's sglang.extra_packages and run {_APPLY}",
        source="Python's ImportError for `from xgrammar import StructuralTag` with the real "
        "xgrammar 0.1.10 (sglang 0.5.11 sglang/srt/constrained/xgrammar_backend.py)",
    ),
    Signature(
        id="flashinfer-no-mm-mxfp8",
        pattern=r"cannot import name '?mm_mxfp8'? from '?flashinfer",
        diagnosis="flashinfer-python is older than 0.6.4 (no mm_mxfp8), which sglang 0.5.11 "
        "imports on Blackwell GPUs",
        remedy="add 'flashinfer-python==0.6.8.post1' to the deployment's "
        f"sglang.extra_packages and run {_APPLY}",
        source="Python's ImportError for `from flashinfer import mm_mxfp8` with the real "
        "flashinfer-python 0.6.3 (sglang 0.5.11 sglang/srt/layers/quantization/fp8_utils.py)",
    ),
    Signature(
        id="cuda-driver-missing",
        pattern=r"libcuda\.so\.1: cannot open shared object file",
        diagnosis="the NVIDIA driver library libcuda.so.1 is not visible to the service",
        remedy=f"install or load the NVIDIA driver on the host, then {_DOCTOR}",
        source="the dynamic loader's dlopen error (glibc dl-load), as printed by Python's "
        "ImportError for an extension module",
    ),
    Signature(
        id="abi-missing-cuda-library",
        pattern=r"(?P<lib>lib(?:cu|nv|nccl|c10|torch|caffe2)[\w+-]*\.so(?:\.(?P<major>\d+))?"
        r"(?:\.\d+)*): cannot open shared object file",
        diagnosis="a compiled extension (sgl_kernel or torch) needs a CUDA/torch library the "
        "venv does not provide: the venv mixes CUDA lanes (ABI mismatch)",
        remedy=_OVERLAY,
        source="the dynamic loader's dlopen error (glibc dl-load) when importing sgl_kernel's "
        "common_ops.abi3.so (DT_NEEDED libnvrtc.so.13, libcudart.so.13) in a cu128 venv",
    ),
    Signature(
        id="abi-undefined-symbol",
        pattern=r"undefined symbol: _ZN3c10\w*",
        diagnosis="a compiled extension (sgl_kernel) was built against another torch: "
        "undefined c10 symbol (ABI mismatch)",
        remedy=f"{_OVERLAY} ({remedies.doctor('{host}', '--venv', '{venv}')} names the lane)",
        source="the dynamic loader's dlopen error (glibc dl-lookup, RTLD_NOW) for an extension "
        "referencing a c10 symbol the loaded libc10.so lacks",
    ),
    Signature(
        id="flashinfer-sm12-guard",
        pattern=r"FlashInfer requires GPUs with sm75 or higher",
        diagnosis="FlashInfer dropped the SM 12.x GPU: its JIT needs CUDA >= 12.9 for SM 12.x "
        "and found an older nvcc (or torch's CUDA)",
        remedy=_service_up("--attention-backend triton"),
        source="flashinfer-python 0.6.8.post1 flashinfer/jit/core.py check_cuda_arch()",
    ),
    Signature(
        id="flashinfer-sm12-warning",
        pattern=r"SM 12\.x requires CUDA >= 12\.9",
        diagnosis="FlashInfer skips SM 12.x because the CUDA it found is older than 12.9",
        remedy=_service_up("--attention-backend triton"),
        source="flashinfer-python 0.6.8.post1 flashinfer/compilation_context.py",
        fatal=False,
    ),
    Signature(
        id="gpu-unavailable",
        pattern=r"cudaErrorDevicesUnavailable|CUDA-capable device\(s\) is/are busy or "
        r"unavailable",
        diagnosis="the GPU given to the service is dead or held exclusively by another process",
        remedy=f"{_service_up('--gpu N')} with N a live, free GPU ({_INVENTORY} shows them)",
        source="CUDA runtime cudaGetErrorName/cudaGetErrorString(46) in the real "
        "libcudart.so.13 (nvidia-cuda-runtime 13.0.96), as torch's 'CUDA error: ...' prints it",
    ),
    Signature(
        id="gpu-not-visible",
        pattern=r"No CUDA GPUs are available|CUDA error: invalid device ordinal",
        diagnosis="CUDA_VISIBLE_DEVICES names no usable GPU (a wrong index, or fewer GPUs "
        "than --tp-size)",
        remedy=f"{_service_up('--gpu N')} with N an existing GPU ({_INVENTORY})",
        source="torch's RuntimeError when CUDA sees no device (torch/cuda/__init__.py _lazy_init)",
    ),
    Signature(
        id="cuda-oom",
        pattern=r"CUDA out of memory|torch\.OutOfMemoryError|CUDA error: out of memory",
        diagnosis="CUDA ran out of GPU memory: the static pool leaves too little for "
        "activations and CUDA graphs, or another process uses the GPU",
        remedy=f"{_service_up('--mem-fraction-static 0.8')} (lower than now), or "
        f"{_service_up('--gpu N')} with N a free GPU",
        source="torch's CUDA caching allocator (torch.OutOfMemoryError: CUDA out of memory...) "
        "and cudaGetErrorString(2) 'out of memory' of the real libcudart.so.13",
    ),
    Signature(
        id="kv-cache-no-memory",
        pattern=r"Not enough memory\. Please try to increase --mem-fraction-static",
        diagnosis="no GPU memory left for the KV cache after the weights: another process "
        "holds memory on this GPU, or --mem-fraction-static is too small for the model",
        remedy=f"{_service_up('--gpu N')} with N a free GPU ({_INVENTORY}), or a "
        "higher --mem-fraction-static when the GPU is free",
        source="sglang 0.5.11 sglang/srt/model_executor/pool_configurator.py (RuntimeError)",
    ),
    Signature(
        id="port-in-use",
        pattern=r"\[Errno 98\]|address already in use",
        diagnosis="the service's port is already held by another process",
        remedy=f"{_service_up('--port P')} with P a free port ({_INVENTORY} shows the "
        "listeners), or stop the holder",
        source="asyncio create_server's OSError '[Errno 98] error while attempting to bind on "
        "address ...: address already in use', logged by uvicorn server.py (logger.error(exc))",
        ignore_case=True,
    ),
    Signature(
        id="model-path-missing",
        pattern=r"Incorrect path_or_model_id: |does not appear to have a file named config\.json",
        diagnosis="the model path does not exist on the host or has no config.json",
        remedy=f"fix the deployment's model path in hosts.yaml, then {_DOCTOR}",
        source="Hugging Face transformers cached_file (utils/hub.py) errors for a missing model",
    ),
)

BY_ID: dict[str, Signature] = {s.id: s for s in SIGNATURES}


class _Placeholders(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return key.upper()


def fill_remedy(template: str, context: Mapping[str, object]) -> str:
    values = _Placeholders({k: str(v) for k, v in context.items() if v not in (None, "")})
    return template.format_map(values)


def match_line(line: str, context: Mapping[str, object] | None = None) -> Match | None:
    """The first signature matching ``line`` (in table order), its remedy filled."""
    for sig in SIGNATURES:
        found = sig.regex.search(line)
        if found is None:
            continue
        groups = {k: v for k, v in found.groupdict().items() if v is not None}
        ctx: dict[str, object] = dict(context or {})
        if "major" in groups and groups["major"] in _LANES:
            ctx["lane"] = _LANES[groups["major"]]
        return Match(sig.id, line.strip(), sig.diagnosis, fill_remedy(sig.remedy, ctx),
                     sig.fatal, groups)
    return None


def scan(lines: Iterable[str], context: Mapping[str, object] | None = None) -> list[Match]:
    """Every signature found in ``lines``, once per id (the first line that shows it)."""
    found: dict[str, Match] = {}
    for line in lines:
        match = match_line(line, context)
        if match is not None and match.id not in found:
            found[match.id] = match
    return list(found.values())
