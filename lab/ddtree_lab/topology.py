"""The lab's topology: a rehearsal of the story's hosts on this machine.

Only the lab package knows these names and addresses; the rest of the tool reads
them from hosts.yaml like any other host.

Each host gets its own network namespace joined to the workstation (the root
namespace) by one veth pair on a /30. A namespace has no default route, so a lab
host reaches the workstation and nothing else: ct129 and ct200 cannot reach each
other (as in the story) and no lab host reaches the internet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Real wheels the lab installs (small enough to download); pinned as in the story.
REAL_WHEELS: tuple[str, ...] = (
    "sglang==0.5.11",
    "sglang==0.5.10",
    "xgrammar==0.1.32",
    "xgrammar==0.1.10",
    "flashinfer-python==0.6.8.post1",
    "flashinfer-python==0.6.3",
    "soundfile==0.13.1",
    "cffi==2.0.0",
    "pycparser==2.23",
    "nvidia-cuda-runtime-cu12==12.8.90",
    "nvidia-cuda-runtime==13.0.96",
)

SUBNET_PREFIX = "10.77"


@dataclass(frozen=True)
class LabGpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_mib: int
    compute_cap: str
    power_limit_w: int
    dead: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "memory_total_mib": self.memory_total_mib,
            "compute_cap": self.compute_cap,
            "power_limit_w": self.power_limit_w,
            "dead": self.dead,
        }


@dataclass(frozen=True)
class VenvRecipe:
    """A venv the lab builds inside a host: which wheels, by requirement string.

    Names starting with ``standin:`` are built by the lab (see standin_wheels);
    the others are real wheels from the registry, installed with --no-deps.
    """

    path: str
    packages: tuple[str, ...]


@dataclass(frozen=True)
class LabHost:
    name: str
    kind: str  # the cached provisioning layer it shares: "ct129" or "ct200"
    octet: int  # third octet of its /30
    gpus: tuple[LabGpu, ...]
    venvs: tuple[VenvRecipe, ...]
    units: tuple[str, ...] = field(default_factory=tuple)  # lab units enabled at boot
    nvcc_release: str | None = None  # a CUDA toolkit under /usr/local/cuda, as on ct200

    @property
    def address(self) -> str:
        return f"{SUBNET_PREFIX}.{self.octet}.2"

    @property
    def gateway(self) -> str:
        return f"{SUBNET_PREFIX}.{self.octet}.1"

    @property
    def netns(self) -> str:
        return f"ddtl-{self.name}"

    @property
    def veth(self) -> str:
        return f"ddtl-{self.name}"[:15]


DRIVER_VERSION = "580.95.05"
CUDA_VERSION = "13.0"


def _uuid(host: int, index: int) -> str:
    # Deterministic, well-formed GPU UUIDs (8-4-4-4-12 hex), different per host and index.
    return f"GPU-{host:04x}{index:04x}-1ab2-4c3d-8e4f-{host:06x}{index:06x}"


def _a6000(index: int, dead: bool = False) -> LabGpu:
    return LabGpu(
        index=index,
        name="NVIDIA RTX A6000",
        uuid=_uuid(129, index),
        pci_bus_id=f"00000000:{0x41 + index:02X}:00.0",
        memory_total_mib=49140,
        compute_cap="8.6",
        power_limit_w=300,
        dead=dead,
    )


def _pro6000(host_octet: int, index: int) -> LabGpu:
    return LabGpu(
        index=index,
        name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        uuid=_uuid(host_octet, index),
        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        memory_total_mib=97887,
        compute_cap="12.0",
        power_limit_w=600,
    )


CU130_STACK = (
    "standin:torch-cu130",
    "nvidia-cuda-runtime==13.0.96",
    "standin:nvidia-cu130",
    "standin:triton",
    "standin:torchvision-cu130",
)
CU128_STACK = (
    "standin:torch-cu128",
    "nvidia-cuda-runtime-cu12==12.8.90",
    "standin:nvidia-cu128",
    "standin:triton",
    "standin:torchvision-cu128",
)

CT129_VENVS = (
    VenvRecipe(
        "/root/ml-env",
        CU130_STACK
        + (
            "sglang==0.5.11",
            "standin:sglang-kernel",
            "flashinfer-python==0.6.8.post1",
            "xgrammar==0.1.32",
            "soundfile==0.13.1",
            "cffi==2.0.0",
            "pycparser==2.23",
            "standin:lab-server",
        ),
    ),
)

CT200_VENVS = (
    # The lab's launch_server stand-in rides in every lab venv (its .pth acts only where the
    # real sglang gets installed), so a clone of the training venv can serve once it does.
    VenvRecipe("/root/venv", (*CU128_STACK, "standin:lab-server")),
    VenvRecipe(
        "/root/venv_sglang",
        CU128_STACK
        + (
            "sglang==0.5.10",
            "flashinfer-python==0.6.3",
            "xgrammar==0.1.10",
            "standin:lab-server",
        ),
    ),
)


def ct129() -> LabHost:
    return LabHost(
        name="ct129",
        kind="ct129",
        octet=129,
        gpus=(_a6000(0), _a6000(1, dead=True)),
        venvs=CT129_VENVS,
    )


def ct200_like(name: str, octet: int) -> LabHost:
    return LabHost(
        name=name,
        kind="ct200",
        octet=octet,
        gpus=tuple(_pro6000(octet, i) for i in range(8)),
        venvs=CT200_VENVS,
        units=("qwen-wrapper.service",),
        nvcc_release="12.8",
    )


def lab_hosts(extra: int = 0) -> list[LabHost]:
    """ct129, ct200, and ``extra`` more hosts like ct200 (ct201, ct202, ...)."""
    if extra < 0 or extra > 50:
        raise ValueError("--extra must be between 0 and 50")
    hosts = [ct129(), ct200_like("ct200", 200)]
    hosts += [ct200_like(f"ct{201 + i}", 201 + i) for i in range(extra)]
    return hosts


def gpu_spec_json(host: LabHost) -> dict[str, object]:
    return {
        "driver_version": DRIVER_VERSION,
        "cuda_version": CUDA_VERSION,
        "gpus": [g.as_json() for g in host.gpus],
    }
