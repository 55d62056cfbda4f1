"""The facts a host's probe returns, as typed models on the workstation.

The probe (remote/facts.py) runs on the host with nothing but Python's standard
library and prints one JSON object of this shape. Each part carries its own
`error` (None when it worked): one failing part never sinks the others.
Unknown keys are kept out (extra="ignore") so an older workstation can read a
newer probe.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

SCHEMA_VERSION = 2


class Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    error: str | None = None  # why this part (or some of it) could not be read


class Disk(BaseModel):
    model_config = ConfigDict(extra="ignore")
    path: str
    free_mib: int
    total_mib: int


class HostInfo(Part):
    hostname: str | None = None
    os: str | None = None  # PRETTY_NAME of /etc/os-release
    kernel: str | None = None
    glibc: str | None = None  # "2.36"
    cpu_count: int | None = None
    mem_total_mib: int | None = None
    mem_available_mib: int | None = None
    disks: list[Disk] = Field(default_factory=list)  # where venvs live (and /)
    python: str | None = None  # the interpreter that ran the probe


class GpuProcess(BaseModel):
    model_config = ConfigDict(extra="ignore")
    pid: int
    name: str | None = None
    used_mib: int | None = None
    ports: list[int] = Field(default_factory=list)  # TCP ports this PID listens on
    unit: str | None = None  # systemd unit owning the PID, where known


class Gpu(BaseModel):
    model_config = ConfigDict(extra="ignore")
    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_cap: str | None = None  # "12.0"
    dead: bool = False
    error: str | None = None  # why it is dead / what failed
    processes: list[GpuProcess] = Field(default_factory=list)


class NvidiaInfo(Part):
    present: bool = False  # NVML (or nvidia-smi) found and answered
    source: str | None = None  # "nvml" or "nvidia-smi": where the GPU facts came from
    driver_version: str | None = None  # "580.95.05"
    cuda_version: str | None = None  # the CUDA version the driver supports, "13.0"
    gpus: list[Gpu] = Field(default_factory=list)


class TorchInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: str | None = None  # from torch/version.py, with local tag: "2.11.0+cu130"
    cuda: str | None = None  # torch/version.py `cuda`: "13.0", None for CPU builds
    dist_version: str | None = None  # from dist-info (the real cu130 wheel says "2.11.0")


class Extension(BaseModel):
    """A compiled shared object inside the venv and the CUDA libraries it needs."""

    model_config = ConfigDict(extra="ignore")
    path: str  # relative to site-packages: "sgl_kernel/sm90/common_ops.abi3.so"
    distribution: str | None = None  # owning distribution (from RECORD), canonical name
    needed: list[str] = Field(default_factory=list)  # DT_NEEDED entries that are CUDA libs
    cuda_majors: list[int] = Field(default_factory=list)  # from libcudart/libnvrtc/libcublas...
    rpath: list[str] = Field(default_factory=list)  # RUNPATH if set, else RPATH
    error: str | None = None  # the ELF could not be read (truncated, 32-bit, not ELF)


class NvidiaLayout(BaseModel):
    model_config = ConfigDict(extra="ignore")
    cu12_components: list[str] = Field(default_factory=list)  # nvidia/<comp>/lib with .so.12
    cu13: bool = False  # nvidia/cu13/lib present
    other: list[str] = Field(default_factory=list)  # cudnn, nccl, nvshmem, cusparselt ...
    lib_dirs: list[str] = Field(default_factory=list)  # every nvidia/*/lib folder, absolute


class PayloadInfo(BaseModel):
    """The payload a venv holds (ddtree-deploy payload), read from its state file."""

    model_config = ConfigDict(extra="ignore")
    payload: str | None = None
    version: str | None = None
    digest: str | None = None  # what it installed, as one hash (None: an earlier tool's state)
    intact: bool | None = None  # its files are still the bytes it installed
    error: str | None = None  # the state could not be read
    form: str = "patch"  # patch (files in sglang) | plugin (a distribution SGLang loads)
    sglang: str | None = None  # the sglang version it was made for


class SglangInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: str | None = None
    dflash_modules: list[str] = Field(default_factory=list)  # dflash_worker.py, ...
    ddtree_modules: list[str] = Field(default_factory=list)  # ddtree_*.py found
    spec_algorithms: list[str] = Field(default_factory=list)  # SpeculativeAlgorithm members
    knows_ddtree: bool | None = None
    ddtree_is_dflash: bool | None = None
    server_flags: list[str] = Field(default_factory=list)  # --speculative-ddtree-* defined
    spec_error: str | None = None  # why spec_info could not be read
    spec_source: str | None = None  # "runtime" (loaded by path in the venv's python) | "static"
    spec_runtime_error: str | None = None  # why loading failed when spec_source is "static"
    payload: PayloadInfo | None = None  # None: no payload state in the venv


class Venv(Part):
    path: str
    declared: bool = False  # named in hosts.yaml (else discovered)
    exists: bool = True
    python_version: str | None = None  # "3.11.2"
    site_packages: str | None = None
    distributions: dict[str, str] = Field(default_factory=dict)  # canonical name -> version
    torch: TorchInfo | None = None
    extensions: list[Extension] = Field(default_factory=list)
    nvidia: NvidiaLayout = Field(default_factory=NvidiaLayout)
    sglang: SglangInfo | None = None
    names: dict[str, list[str]] = Field(default_factory=dict)
    # names[...] = module-level names a package defines, read from its files without importing
    # it: "flashinfer" -> ["mm_mxfp8", ...] (only the names rules ask about), "xgrammar" -> [...]


class Unit(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    load: str | None = None
    active: str | None = None
    sub: str | None = None
    description: str | None = None
    main_pid: int | None = None


class Listener(BaseModel):
    model_config = ConfigDict(extra="ignore")
    port: int
    address: str
    pid: int | None = None
    process: str | None = None
    unit: str | None = None


class Services(Part):
    uv: str | None = None  # uv's path on the host
    nvcc: str | None = None  # nvcc as flashinfer finds it (CUDA_HOME, PATH, /usr/local/cuda)
    nvcc_version: str | None = None  # "12.8"
    units: list[Unit] = Field(default_factory=list)  # names matching sglang|ddtree (+ GPU holders)
    listeners: list[Listener] = Field(default_factory=list)


class ToolState(Part):
    """What this tool left on the host: its units (exact text), pending restarts and each
    service's secrets digest (stem -> digest, root-only on the host: service/endpoint.py)."""

    managed_units: dict[str, str] = Field(default_factory=dict)
    pending_restarts: list[str] = Field(default_factory=list)
    secrets_digests: dict[str, str] = Field(default_factory=dict)
    secrets_unread: list[str] = Field(default_factory=list)  # stems: not root, sudo reads them


class ModelDir(BaseModel):
    """A model folder on the host: its config.json as read (never the weights)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    path: str
    config: dict[str, Any] | None = None
    error: str | None = None


class ProbeMemo(BaseModel):
    """How much the probe reused from its memo on the host (remote/facts_memo.py)."""

    model_config = ConfigDict(extra="ignore")
    path: str | None = None
    hits: int = 0
    misses: int = 0
    error: str | None = None


class Facts(BaseModel):
    model_config = ConfigDict(extra="ignore")
    schema_version: int = SCHEMA_VERSION
    host: str  # the name in hosts.yaml
    taken_at: float = 0.0  # epoch seconds, set by the workstation
    duration_s: float | None = None
    host_info: HostInfo = Field(default_factory=HostInfo)
    nvidia: NvidiaInfo = Field(default_factory=NvidiaInfo)
    venvs: list[Venv] = Field(default_factory=list)
    services: Services = Field(default_factory=Services)
    models: list[ModelDir] = Field(default_factory=list)
    tool: ToolState = Field(default_factory=ToolState)
    probe_memo: ProbeMemo = Field(default_factory=ProbeMemo)

    @field_validator("taken_at", mode="before")
    @classmethod
    def _taken_at(cls, value: Any) -> Any:
        """Seconds since the epoch (the cache), or ISO-8601 text (`inventory --json`)."""
        if isinstance(value, str):
            from ddtree_deploy.isotime import epoch

            try:
                return epoch(value)
            except ValueError:
                return value  # pydantic says what is wrong with it
        return value

    #: kept in the facts cache for plan, never printed (service/endpoint.py)
    NOT_SHOWN: ClassVar[dict[str, Any]] = {"tool": {"secrets_digests"}}

    def shown(self) -> dict[str, Any]:
        """The facts as JSON for a person or a script (`inventory --json`): without the
        services' secrets digests."""
        return self.model_dump(mode="json", exclude=self.NOT_SHOWN)

    def model(self, path: str) -> ModelDir | None:
        want = path.rstrip("/")
        return next((m for m in self.models if m.path.rstrip("/") == want), None)

    def venv(self, path: str) -> Venv | None:
        want = path.rstrip("/")
        return next((v for v in self.venvs if v.path.rstrip("/") == want), None)
