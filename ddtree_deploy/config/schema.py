"""The hosts.yaml schema: hosts, their venvs and models, and the deployments on them.

Every model is strict (a port is an integer, not the string "22") and forbids
unknown fields. Names are the mapping keys. Loading, cross-references and the
plain-English error messages live in ddtree_deploy.config.hosts (which re-exports these
models); this module holds the shapes and the checks of single values.

Paths may use ``~`` and ``${VAR}`` / ``${VAR:-default}``; they are expanded when
the file is loaded and the text as written is kept for display
(``spec.raw("identity_file")``). Paths on the workstation (identity_file,
known_hosts) may be relative to the hosts file; paths on a host (venvs, models)
must be absolute, and ``~`` is not expanded for them.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, ClassVar, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationInfo,
    model_validator,
)

from ddtree_deploy.service.spec import TOOL_ENVIRONMENT, secret_flag, unit_char_problem

HOST_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
ITEM_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
UNIT_STEM_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.\\-]*\Z")
_HOST_LABEL_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{[^}]*\}?")

CudaLane = Literal["cu128", "cu130"]
VenvRole = Literal["source", "training", "serving", "scratch"]
PROTECTED_ROLES = ("source", "training")  # never written into without venvs.NAME.allow_writes
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
SudoMode = Literal["auto"] | bool


# ---- value checks (each raises ValueError with the expectation; the loader adds "got ...")


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


def _ranged(low: int, high: int | None = None) -> Callable[[int], int]:
    def check(value: int) -> int:
        if high is None and value < low:
            raise ValueError(f"must be {low} or more")
        if high is not None and not low <= value <= high:
            raise ValueError(f"must be {low}-{high}")
        return value

    return check


def _positive(value: float) -> float:
    if value <= 0:
        raise ValueError("must be a number of seconds greater than 0")
    return value


def _non_negative(value: float) -> float:
    if value < 0:
        raise ValueError("must be a number of seconds, 0 or more")
    return value


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


def _matches(pattern: re.Pattern[str], what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"expected {what}")
        return value

    return check


def _address(value: str) -> str:
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    if len(value) > 253 or not all(_HOST_LABEL_RE.match(label) for label in labels):
        raise ValueError("expected a hostname or an IP address")
    return value


def _no_space(value: str) -> str:
    if not value or any(c.isspace() for c in value) or "@" in value:
        raise ValueError("expected a non-empty name without spaces or '@'")
    return value


def _version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError("expected a PEP 440 version such as 0.5.11") from None
    return value


def _requirement(value: str) -> str:
    try:
        Requirement(value)
    except InvalidRequirement:
        raise ValueError("expected a PEP 508 requirement such as 'soundfile==0.13.1'") from None
    return value


def _unit_stem(value: str) -> str:
    if value.endswith(".service"):
        raise ValueError("expected the unit name without '.service'")
    if not UNIT_STEM_RE.match(value) or len(value) > 240:
        raise ValueError("expected a systemd unit name (letters, digits, ':', '_', '.', '-')")
    return value


ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]*\Z")
# Names that say "this is a secret": units are world-readable (render.py refuses them too).
_SECRET_ENV_RE = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|PRIVATE")


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


def _python(value: str) -> str:
    if not re.match(r"3\.\d{1,2}\Z", value):
        raise ValueError('expected a Python version such as "3.11"')
    return value


def _sudo(value: Any) -> Any:
    if value == "auto" or isinstance(value, bool):
        return value
    raise ValueError("expected auto, true or false")


def _local_path(value: Any, info: ValidationInfo) -> Path:
    text = quoted_text("a path")(value)
    expanded = Path(expand_vars(text)).expanduser()
    base = (info.context or {}).get("base_dir")
    if not expanded.is_absolute() and isinstance(base, Path):
        expanded = base / expanded
    return expanded


def _remote_path(value: Any) -> PurePosixPath:
    text = quoted_text("an absolute path")(value)
    expanded = expand_vars(text)
    if not expanded.startswith("/"):
        hint = " ('~' is not expanded for paths on a host)" if expanded.startswith("~") else ""
        raise ValueError(f"expected an absolute path on the host{hint}")
    _unit_text(expanded)
    return PurePosixPath(expanded)


Port = Annotated[int, AfterValidator(_ranged(1, 65535))]
NonNegInt = Annotated[int, AfterValidator(_ranged(0))]
PosInt = Annotated[int, AfterValidator(_ranged(1))]
TreeSize = Annotated[int, AfterValidator(_ranged(1, 1024))]
Seconds = Annotated[float, AfterValidator(_positive)]
NonNegSeconds = Annotated[float, AfterValidator(_non_negative)]
Fraction = Annotated[float, AfterValidator(_fraction)]
ItemName = Annotated[
    str, BeforeValidator(quoted_text("a name")),
    AfterValidator(_matches(ITEM_NAME_RE, "a name of letters, digits, '.', '_' and '-'")),
]  # fmt: skip
RefName = Annotated[str, BeforeValidator(quoted_text("a name"))]
LocalPath = Annotated[Path, BeforeValidator(_local_path)]
RemotePath = Annotated[PurePosixPath, BeforeValidator(_remote_path)]
Address = Annotated[
    str, BeforeValidator(quoted_text("a hostname or IP address")), AfterValidator(_address)
]
SshName = Annotated[str, BeforeValidator(quoted_text("a name")), AfterValidator(_no_space)]
PepVersion = Annotated[str, BeforeValidator(quoted_text("a version")), AfterValidator(_version)]
PepRequirement = Annotated[
    str, BeforeValidator(quoted_text("a requirement")), AfterValidator(_requirement)
]
UnitStem = Annotated[str, BeforeValidator(quoted_text("a unit name")), AfterValidator(_unit_stem)]
PythonVersion = Annotated[
    str, BeforeValidator(quoted_text('a Python version such as "3.11"')), AfterValidator(_python)
]
Sudo = Annotated[SudoMode, PlainValidator(_sudo)]
EnvName = Annotated[
    str, BeforeValidator(quoted_text("a variable name")), AfterValidator(_env_name)
]
EnvValue = Annotated[
    str, BeforeValidator(quoted_text("a value")), AfterValidator(_env_value)
]
ServerArg = Annotated[
    str, BeforeValidator(quoted_text("an argument")), AfterValidator(_server_arg)
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # Fields whose text as written is kept for display (paths with ~ and ${VAR}).
    RAW_FIELDS: ClassVar[tuple[str, ...]] = ()
    _raw: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_raw(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        model = handler(data)
        if isinstance(data, dict) and isinstance(model, _Model):
            raw: dict[str, str] = {}
            for name in cls.RAW_FIELDS:
                value = data.get(name)
                if isinstance(value, str):
                    raw[name] = value
                elif isinstance(value, dict):
                    raw.update({f"{name}.{k}": v for k, v in value.items() if isinstance(v, str)})
            model._raw = raw
        return model

    def raw(self, field: str) -> str | None:
        """The text of a path field as written in the file (``"models.default"`` for a model)."""
        if field in self._raw:
            return self._raw[field]
        head, _, key = field.partition(".")
        value = getattr(self, head, None)
        if key and isinstance(value, dict):
            value = value.get(key)
        return None if value is None else str(value)


class ExpectedGpus(_Model):
    count: NonNegInt
    model: Annotated[str, BeforeValidator(quoted_text("a GPU model name"))] | None = None


class VenvCreate(_Model):
    """How to create a missing venv: exactly one of clone (a venv on this host) or python."""

    clone: RefName | None = None
    python: PythonVersion | None = None


class VenvSpec(_Model):
    RAW_FIELDS = ("path",)

    path: RemotePath
    role: VenvRole
    create: VenvCreate | None = None
    # a source ("never modified") or training ("leave it alone") venv is written into
    # (packages, CUDA lane, payload, a clone into it) only when this says so
    allow_writes: bool = False

    @property
    def protected(self) -> bool:
        """Whether the tool refuses to write into this venv (its role, not overridden)."""
        return self.role in PROTECTED_ROLES and not self.allow_writes


class HostSpec(_Model):
    """A machine reached over SSH (or the workstation itself, transport "local")."""

    RAW_FIELDS = ("identity_file", "known_hosts", "models")

    name: str
    transport: Literal["ssh", "local"] = "ssh"
    address: Address | None = None
    ssh_alias: SshName | None = None
    port: Port = 22
    user: SshName = "root"
    identity_file: LocalPath | None = None
    jump: RefName | None = None
    known_hosts: LocalPath = Field(default_factory=lambda: Path.home() / ".ssh" / "known_hosts")
    connect_timeout: Seconds = 10.0
    command_timeout: Seconds = 600.0
    # Reads (facts) go through an OpenSSH master connection kept open this long after its
    # last use, as Ansible does; 0: a new connection each time (paramiko).
    ssh_persist: NonNegSeconds = 60.0
    sudo: Sudo = "auto"
    gpus: ExpectedGpus | None = None
    venvs: dict[ItemName, VenvSpec] = Field(default_factory=dict)
    models: dict[ItemName, RemotePath] = Field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.transport == "local"

    @property
    def use_sudo(self) -> bool:
        """Whether privileged commands go through ``sudo -n``."""
        if self.sudo == "auto":
            return not self.is_local and self.user != "root"
        return bool(self.sudo)

    @property
    def target(self) -> str:
        """What to connect to: the address, else the ~/.ssh/config alias, else 'localhost'."""
        return self.address or self.ssh_alias or "localhost"

    @property
    def default_model(self) -> PurePosixPath | None:
        return self.models.get("default")


class SglangSpec(_Model):
    version: PepVersion
    extra_packages: list[PepRequirement] = Field(default_factory=list)

    @property
    def parsed_version(self) -> Version:
        return Version(self.version)


class DdtreeSpec(_Model):
    budget: TreeSize
    topk: TreeSize
    shadow_linear: bool = False


class Deployment(_Model):
    """One SGLang service on one host; the systemd unit is ``<service or name>.service``."""

    RAW_FIELDS = ("model_path", "draft_model_path")

    name: str
    service: UnitStem | None = None
    host: RefName
    venv: RefName
    cuda_lane: CudaLane
    sglang: SglangSpec
    payload: bool = True
    gpu: NonNegInt | None = None
    port: Port | None = None
    model_path: RemotePath | None = None
    draft_model_path: RemotePath | None = None
    algorithm: Algorithm = "none"
    ddtree: DdtreeSpec | None = None
    attention_backend: AttentionBackend | None = None
    grammar_backend: GrammarBackend | None = None
    sampling_backend: SamplingBackend | None = None
    mem_fraction_static: Fraction | None = None
    context_length: PosInt | None = None
    tp_size: PosInt = 1
    cuda_graph: bool = True
    extra_args: list[ServerArg] = Field(default_factory=list)
    # Environment= lines of the unit (NCCL, CUDA variables a site's hardware needs)
    environment: dict[EnvName, EnvValue] = Field(default_factory=dict)

    @property
    def service_name(self) -> str:
        return self.service or self.name

    @property
    def unit_name(self) -> str:
        return f"{self.service_name}.service"

    @property
    def gpu_indices(self) -> range | None:
        """The GPUs this service uses (gpu .. gpu+tp_size-1), None while gpu is not chosen."""
        return None if self.gpu is None else range(self.gpu, self.gpu + self.tp_size)


def local_host() -> HostSpec:
    """The workstation itself; needs no entry in hosts.yaml."""
    return HostSpec(name="localhost", transport="local")
