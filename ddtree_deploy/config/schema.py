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
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, ClassVar, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationInfo,
    model_validator,
)

from ddtree_deploy.settings.model import DdtreeSettings, ServerSettings
from ddtree_deploy.settings.values import (
    MAX_GPUS,
    Port,
    RemotePath,
    StrictModel,
    expand_vars,
    quoted_text,
    ranged,
    unit_char_problem,
)

HOST_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
ITEM_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
UNIT_STEM_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.\\-]*\Z")
USER_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")  # systemd's User= and useradd's
_HOST_LABEL_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")

CudaLane = Literal["cu128", "cu130"]
VenvRole = Literal["source", "training", "serving", "scratch"]
PROTECTED_ROLES = ("source", "training")  # never written into without venvs.NAME.allow_writes
SudoMode = Literal["auto"] | bool


# ---- value checks (each raises ValueError with the expectation; the loader adds "got ...")


MAX_SECONDS = 7 * 86400.0  # a timeout longer than a week is a typo (or .inf, or .nan)


def _positive(value: float) -> float:
    if not 0 < value <= MAX_SECONDS:
        raise ValueError(f"must be a number of seconds greater than 0, at most {MAX_SECONDS:.0f}")
    return value


def _non_negative(value: float) -> float:
    if not 0 <= value <= MAX_SECONDS:
        raise ValueError(f"must be a number of seconds, 0 to {MAX_SECONDS:.0f}")
    return value


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
    problem = unit_char_problem(value)
    if problem:
        raise ValueError(f"expected a name without control characters: it {problem}")
    return value


def _user_name(value: str) -> str:
    if not USER_NAME_RE.match(value):
        raise ValueError("expected a user name of the host (letters, digits, '_', '.' and '-', "
                         "not starting with '-', at most 32 characters)")
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


Seconds = Annotated[float, AfterValidator(_positive)]
NonNegSeconds = Annotated[float, AfterValidator(_non_negative)]
ItemName = Annotated[
    str, BeforeValidator(quoted_text("a name")),
    AfterValidator(_matches(ITEM_NAME_RE, "a name of letters, digits, '.', '_' and '-'")),
]  # fmt: skip
RefName = Annotated[str, BeforeValidator(quoted_text("a name"))]
LocalPath = Annotated[Path, BeforeValidator(_local_path)]
Address = Annotated[
    str, BeforeValidator(quoted_text("a hostname or IP address")), AfterValidator(_address)
]
SshName = Annotated[str, BeforeValidator(quoted_text("a name")), AfterValidator(_no_space)]
UserName = Annotated[str, BeforeValidator(quoted_text("a user name")),
                     AfterValidator(_user_name)]
PepVersion = Annotated[str, BeforeValidator(quoted_text("a version")), AfterValidator(_version)]
PepRequirement = Annotated[
    str, BeforeValidator(quoted_text("a requirement")), AfterValidator(_requirement)
]
UnitStem = Annotated[str, BeforeValidator(quoted_text("a unit name")), AfterValidator(_unit_stem)]
PythonVersion = Annotated[
    str, BeforeValidator(quoted_text('a Python version such as "3.11"')), AfterValidator(_python)
]
Sudo = Annotated[SudoMode, PlainValidator(_sudo)]


class _Model(StrictModel):

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
    count: Annotated[int, AfterValidator(ranged(0, MAX_GPUS))]
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


DdtreeSpec = DdtreeSettings  # a deployment's ddtree: block (settings.model)


class Deployment(_Model, ServerSettings):
    """One SGLang service on one host; the systemd unit is ``<service or name>.service``.

    Its server fields (algorithm, ddtree, backends, gpu, port, ...) are ServerSettings'
    own: one model, one set of ranges and rules; the loader runs the rules between fields
    after its type checks (``rule_problems``)."""

    RAW_FIELDS = ("model_path", "draft_model_path")

    name: str
    service: UnitStem | None = None
    host: RefName
    venv: RefName
    cuda_lane: CudaLane
    sglang: SglangSpec
    payload: bool = True
    # The endpoint (service/endpoint.py): the address the server binds (default 0.0.0.0,
    # every interface), the user it runs as (default root), and its secrets, each read from
    # a file on the workstation into a 0600 file on the host (never argv, unit or journal).
    bind: Address | None = None
    user: UserName | None = None
    api_key_file: LocalPath | None = None
    hf_token_file: LocalPath | None = None

    @property
    def service_name(self) -> str:
        return self.service or self.name

    @property
    def unit_name(self) -> str:
        return f"{self.service_name}.service"


def local_host() -> HostSpec:
    """The workstation itself; needs no entry in hosts.yaml."""
    return HostSpec(name="localhost", transport="local")
