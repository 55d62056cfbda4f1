"""The values a server's settings are made of: checks of single values, shared with hosts.yaml.

Each check raises ValueError with what was expected; the caller (hosts.yaml's loader, the
settings' merge) adds where and what was got. Paths on a host may use ``${VAR}`` and
``${VAR:-default}``, expanded when read; they must be absolute and ``~`` is not expanded.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

Algorithm = Literal["none", "dflash", "ddtree"]
# sglang 0.5.11 ATTENTION_BACKEND_CHOICES (sglang/srt/server_args.py).
AttentionBackend = Literal[
    "triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4",
    "flashinfer", "flashmla", "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn",
    "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
]  # fmt: skip
GrammarBackend = Literal["xgrammar", "outlines", "llguidance", "none"]
# sglang 0.5.11 SAMPLING_BACKEND_CHOICES (sglang/srt/server_args.py); unset: flashinfer when
# it imports, else pytorch.
SamplingBackend = Literal["flashinfer", "pytorch", "ascend"]

# Environment variables the tool sets itself, and what decides each: a deployment's
# `environment:` may not set them (the server would get two values).
TOOL_ENVIRONMENT: dict[str, str] = {
    "CUDA_DEVICE_ORDER": "always PCI_BUS_ID, the numbering nvidia-smi and the facts use",
    "CUDA_VISIBLE_DEVICES": "the deployment's gpu and tp_size",
    "LD_LIBRARY_PATH": "the venv's own nvidia library folders",
    "PYTHONUNBUFFERED": "always 1, so the journal gets each log line when it is written",
    "SGLANG_DDTREE_BUDGET": "the deployment's ddtree.budget (SGLang 0.5.17 and later)",
    "SGLANG_DDTREE_TOPK": "the deployment's ddtree.topk (SGLang 0.5.17 and later)",
    "SGLANG_DDTREE_SHADOW_LINEAR": "the deployment's ddtree.shadow_linear (SGLang 0.5.17 and "
                                   "later)",
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


_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{[^}]*\}?")
ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]*\Z")
# Names that say "this is a secret": units are world-readable (render.py refuses them too).
_SECRET_ENV_RE = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|PRIVATE")


class StrictModel(BaseModel):
    """Strict (a port is an integer, not the string "22"), no unknown field, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def expand_vars(raw: str, env: Mapping[str, str] | None = None) -> str:
    """Replace ``${VAR}`` and ``${VAR:-default}`` (default when VAR is unset or empty)."""
    environ = os.environ if env is None else env

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name is None:
            raise ValueError(
                f"bad variable reference {match.group(0)!r}: use ${{NAME}} or ${{NAME:-default}}"
            )
        value = environ.get(name)
        if default is not None:
            return value if value else default
        if value is None:
            raise ValueError(
                f"environment variable {name} is not set (write ${{{name}:-default}} "
                "to give a default)"
            )
        return value

    return _VAR_RE.sub(one, raw)


def ranged(low: int, high: int | None = None) -> Callable[[int], int]:
    def check(value: int) -> int:
        if high is None and value < low:
            raise ValueError(f"must be {low} or more")
        if high is not None and not low <= value <= high:
            raise ValueError(f"must be {low}-{high}")
        return value

    return check


def _fraction(value: float) -> float:
    if not 0 < value < 1:
        raise ValueError("must be between 0 and 1 (exclusive)")
    return value


def quoted_text(what: str) -> Callable[[Any], Any]:
    """Before-check of a string field: a clear message when YAML typed it as something else."""

    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, str):
            if isinstance(value, int | float):
                raise ValueError(f"expected {what} in quotes (YAML reads this as a number)")
            raise ValueError(f"expected {what} (a string)")
        return value

    return check


def _remote_path(value: Any) -> PurePosixPath:
    if isinstance(value, PurePosixPath):  # already read (a layer of settings built from a file)
        return value
    text = quoted_text("an absolute path")(value)
    expanded = expand_vars(text)
    if not expanded.startswith("/"):
        hint = " ('~' is not expanded for paths on a host)" if expanded.startswith("~") else ""
        raise ValueError(f"expected an absolute path on the host{hint}")
    _unit_text(expanded)
    return PurePosixPath(expanded)


def _env_name(value: str) -> str:
    if not ENV_NAME_RE.match(value):
        raise ValueError("expected a variable name of capitals, digits and '_' (not starting "
                         "with a digit), such as NCCL_P2P_DISABLE")
    if value in TOOL_ENVIRONMENT:
        raise ValueError(f"{value} is set by ddtree-deploy itself from "
                         f"{TOOL_ENVIRONMENT[value]}; it cannot be overridden here")
    if _SECRET_ENV_RE.search(value):
        raise ValueError(f"{value} looks like a secret, and a unit file is world-readable: "
                         "use an EnvironmentFile= with mode 0600 instead")
    return value


def _env_value(value: str) -> str:
    problem = unit_char_problem(value)
    if problem:
        raise ValueError(f"expected a value without control characters or line separators: "
                         f"it {problem}")
    return value


def _unit_text(value: str) -> str:
    """A value that ends up in a systemd unit (paths, extra arguments): read alike by systemd
    and by a plain process, so no control character or line separator."""
    problem = unit_char_problem(value)
    if problem:
        raise ValueError(f"expected text without control characters or line separators: "
                         f"it {problem}")
    return value


class SecretValueError(ValueError):
    """A refusal whose value is a secret: the message never repeats it."""

    hide_value = True


def _server_arg(value: str) -> str:
    _unit_text(value)
    if not value:
        raise ValueError("expected a non-empty argument")
    flag = secret_flag(value)
    if flag is not None:
        option = value.split("=", 1)[0]
        named = flag if option == flag else f"{option} (SGLang's argparse reads it as {flag})"
        raise SecretValueError(f"{named} would put a secret into the world-readable unit; pass "
                               "keys through an EnvironmentFile= with mode 0600 instead")
    return value


MAX_GPUS = 64  # GPUs of one host, more than any machine has: a bound, not a guess
Port = Annotated[int, AfterValidator(ranged(1, 65535))]
NonNegInt = Annotated[int, AfterValidator(ranged(0))]
GpuIndex = Annotated[int, AfterValidator(ranged(0, MAX_GPUS - 1))]
GpuCount = Annotated[int, AfterValidator(ranged(1, MAX_GPUS))]
PosInt = Annotated[int, AfterValidator(ranged(1))]
TreeSize = Annotated[int, AfterValidator(ranged(1, 1024))]
Fraction = Annotated[float, AfterValidator(_fraction)]
RemotePath = Annotated[PurePosixPath, BeforeValidator(_remote_path)]
EnvName = Annotated[
    str, BeforeValidator(quoted_text("a variable name")), AfterValidator(_env_name)
]
EnvValue = Annotated[
    str, BeforeValidator(quoted_text("a value")), AfterValidator(_env_value)
]
ServerArg = Annotated[
    str, BeforeValidator(quoted_text("an argument")), AfterValidator(_server_arg)
]
