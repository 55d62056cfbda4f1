"""What one SGLang service is: everything its unit and its probe need, resolved.

Built from a deployment of hosts.yaml (flags override its values) or from flags
alone, plus the host's facts (the venv's real nvidia library folders, GPU and
port choice). Immutable data: rendering and installing read it, never change it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Algorithm = Literal["none", "dflash", "ddtree"]
MANAGED_KEY = "X-DDTreeDeploy-Managed"  # in [Unit]: marks units this tool created
UNIT_DIR = "/etc/systemd/system"
DEPLOYMENT_KEY = "X-DDTreeDeploy-Deployment"  # in [Unit]: the deployment a unit serves
PORT_KEY = "X-DDTreeDeploy-Port"  # in [Unit]: the port its /health answers on
# Environment= variables the unit sets itself, and what in hosts.yaml decides each: a
# deployment's `environment:` may not set them (the unit would carry two values).
TOOL_ENVIRONMENT: dict[str, str] = {
    "CUDA_DEVICE_ORDER": "always PCI_BUS_ID, the numbering nvidia-smi and the facts use",
    "CUDA_VISIBLE_DEVICES": "the deployment's gpu and tp_size",
    "LD_LIBRARY_PATH": "the venv's own nvidia library folders",
    "PYTHONUNBUFFERED": "always 1, so the journal gets each log line when it is written",
}


# Long flags SGLang takes a secret with. Its parser is argparse with abbreviations allowed, so
# any unambiguous prefix (`--api-ke`, `--admin-api`) reaches the same option: all refused.
SECRET_FLAGS = ("--api-key", "--admin-api-key")
# Bidirectional overrides and isolates: text that reads one way and runs another.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


def unit_char_problem(value: str) -> str | None:
    """Why `value` cannot go into a unit, which systemd and a plain process must read alike.

    systemd ends a line at LF, CR and NUL only; Python (and so any reader written in it)
    also at VT, FF, FS, GS, RS, NEL (U+0085), U+2028 and U+2029. C0 and C1 controls would
    reach a terminal raw, and bidirectional overrides make a path read differently from
    what runs. All of them are refused (None: the value can be placed).
    """
    for ch in value:
        category = unicodedata.category(ch)
        if category in ("Cc", "Zl", "Zp", "Cs") or ch in _BIDI:
            name = unicodedata.name(ch, "a control character")
            return (f"contains {ch!r} (U+{ord(ch):04X}, {name}), which systemd and a plain "
                    "process would not read alike")
    return None


def secret_flag(arg: str) -> str | None:
    """The secret flag `arg` reaches through SGLang's argparse (exact or abbreviated), if any."""
    if not arg.startswith("--") or len(arg) <= 2:
        return None
    option = arg.split("=", 1)[0]
    for flag in SECRET_FLAGS:
        if len(option) > 2 and flag.startswith(option):
            return flag
    return None


@dataclass(frozen=True)
class UnitCommand:
    """What a unit runs: argv, its own environment (over the caller's) and working folder.

    The one model both ways of running a service read: `render.py` writes it into the unit
    (quoted for systemd) and `plainproc.py` runs it as it is, so the two cannot differ.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The process's environment: `base` (default: this process's) with the unit's on top."""
        import os

        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged

    def as_json(self) -> dict[str, object]:
        return {"argv": list(self.argv), "environment": dict(self.env),
                "working_directory": self.cwd}


@dataclass(frozen=True)
class ServiceSpec:
    name: str  # unit stem: "sglang-ddtree" -> sglang-ddtree.service
    host: str
    venv: str  # absolute path of the venv on the host
    gpus: tuple[int, ...]  # physical GPU indices -> CUDA_VISIBLE_DEVICES
    port: int
    model_path: str
    deployment: str | None = None  # the hosts.yaml deployment it came from, if any
    bind_host: str = "0.0.0.0"
    draft_model_path: str | None = None
    algorithm: Algorithm = "none"
    ddtree_budget: int | None = None
    ddtree_topk: int | None = None
    ddtree_shadow_linear: bool = False
    num_draft_tokens: int | None = None  # DFlash block size (16 for the -b16 drafters)
    attention_backend: str | None = None
    grammar_backend: str | None = None
    sampling_backend: str | None = None
    mem_fraction_static: float | None = None
    context_length: int | None = None
    tp_size: int = 1
    cuda_graph: bool = True
    extra_args: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()  # hosts.yaml `environment:`, sorted by name
    ld_library_path: tuple[str, ...] = field(default_factory=tuple)  # venv's nvidia lib dirs

    @property
    def unit_name(self) -> str:
        return f"{self.name}.service"

    @property
    def unit_path(self) -> str:
        return f"{UNIT_DIR}/{self.unit_name}"

    @property
    def python(self) -> str:
        return f"{self.venv.rstrip('/')}/bin/python"

    def server_args(self) -> list[str]:
        """`python -m sglang.launch_server` arguments, in a stable order."""
        args = ["--model-path", self.model_path, "--host", self.bind_host,
                "--port", str(self.port)]
        if self.tp_size != 1:
            args += ["--tp-size", str(self.tp_size)]
        if self.algorithm != "none":
            args += ["--speculative-algorithm", self.algorithm.upper()]
            if self.draft_model_path:
                args += ["--speculative-draft-model-path", self.draft_model_path]
            if self.num_draft_tokens is not None:
                args += ["--speculative-num-draft-tokens", str(self.num_draft_tokens)]
        if self.algorithm == "ddtree":
            if self.ddtree_budget is not None:
                args += ["--speculative-ddtree-budget", str(self.ddtree_budget)]
            if self.ddtree_topk is not None:
                args += ["--speculative-ddtree-topk", str(self.ddtree_topk)]
            if self.ddtree_shadow_linear:
                args += ["--speculative-ddtree-shadow-linear"]
        if self.attention_backend:
            args += ["--attention-backend", self.attention_backend]
        if self.grammar_backend:
            args += ["--grammar-backend", self.grammar_backend]
        if self.sampling_backend:
            args += ["--sampling-backend", self.sampling_backend]
        if self.mem_fraction_static is not None:
            args += ["--mem-fraction-static", f"{self.mem_fraction_static:g}"]
        if self.context_length is not None:
            args += ["--context-length", str(self.context_length)]
        if not self.cuda_graph:
            args += ["--disable-cuda-graph"]
        return args + list(self.extra_args)
