"""Version floors and pins the rules check against: DATA, reviewed in one place.

Every entry carries its source. "wheel" means the file was opened and read (METADATA's
Requires-Dist, a module's names); "notes" means /work/shared/notes/field-facts.md. When a
release is not listed here the rules that need it say nothing rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


def parse_version(text: str | None) -> Version | None:
    """A PEP 440 version, or None when missing or unreadable (never raises)."""
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def base_version(text: str | None) -> str | None:
    """ "2.11.0+cu130" -> "2.11.0" (the local tag dropped); None when unreadable."""
    version = parse_version(text)
    return None if version is None else version.public


@dataclass(frozen=True)
class SglangPins:
    """What one sglang release pins (Requires-Dist, exact versions)."""

    version: str
    torch: str
    kernel: tuple[str, str]  # (distribution, version): the kernel package changed name
    flashinfer: str
    xgrammar: str
    soundfile: str
    cuda_major: int | None  # the CUDA major its kernels are built for; None: not recorded
    source: str

    def as_requirements(self) -> dict[str, str]:
        return {
            "torch": self.torch,
            self.kernel[0]: self.kernel[1],
            "flashinfer-python": self.flashinfer,
            "xgrammar": self.xgrammar,
            "soundfile": self.soundfile,
        }


SGLANG_PINS: dict[str, SglangPins] = {
    p.version: p
    for p in (
        SglangPins("0.5.9", "2.9.1", ("sgl-kernel", "0.3.21"), "0.6.3", "0.1.27", "0.13.1",
                   None, "notes: pins table"),
        SglangPins("0.5.10", "2.9.1", ("sglang-kernel", "0.4.1"), "0.6.7.post2", "0.1.32",
                   "0.13.1", 12, "wheel sglang-0.5.10-py3-none-any METADATA (cuda-python==12.9)"),
        SglangPins("0.5.11", "2.11.0", ("sglang-kernel", "0.4.2"), "0.6.8.post1", "0.1.32",
                   "0.13.1", 13,
                   "wheel sglang-0.5.11-cp311 METADATA (cuda-python>=13.0); sglang-kernel 0.4.2 "
                   "objects need libcudart.so.13 (fixtures/real/sglang-kernel-0.4.2-pypi)"),
        SglangPins("0.5.19", "2.13.0", ("sglang-kernel", "0.4.6.post1"), "0.6.18", "0.2.1",
                   "0.13.1", None, "notes: pins table"),
        SglangPins("0.5.23", "2.14.1", ("sglang-kernel", "0.4.10"), "0.7.2", "0.2.7", "0.13.1",
                   13, "notes: pins table (CUDA 12 lane ends at 0.5.19)"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class KernelTorchPin:
    """The torch a kernel build is bound to (C++ ABI): declared in its METADATA or not."""

    torch: str
    declared: bool  # True: Requires-Dist torch==X in the kernel wheel; False: inferred
    source: str


_COPIN = "no torch in its Requires-Dist; built for the torch sglang {} pins (PyPI metadata)"
KERNEL_TORCH_PINS: dict[tuple[str, str], KernelTorchPin] = {
    ("sgl-kernel", "0.3.21"): KernelTorchPin("2.9.1", False, _COPIN.format("0.5.9")),
    ("sglang-kernel", "0.4.1"): KernelTorchPin("2.9.1", False, _COPIN.format("0.5.10")),
    ("sglang-kernel", "0.4.2"): KernelTorchPin(
        "2.11.0", True,
        "wheel METADATA description: 'Requires torch == 2.11.0' (no Requires-Dist line; "
        "fixtures/real/sglang-kernel-0.4.2-pypi)",
    ),
    ("sglang-kernel", "0.4.6.post1"): KernelTorchPin("2.13.0", False, _COPIN.format("0.5.19")),
    ("sglang-kernel", "0.4.10"): KernelTorchPin(
        "2.14.1", True, "PyPI metadata: Requires-Dist torch==2.14.1"
    ),
}
KERNEL_DISTRIBUTIONS = ("sglang-kernel", "sgl-kernel")


@dataclass(frozen=True)
class NameFloor:
    """A module-level name a package gains at a release; older releases lack it."""

    distribution: str
    module: str  # the key of Venv.names the probe fills ("flashinfer", "xgrammar")
    name: str
    first: str
    source: str


STRUCTURAL_TAG = NameFloor(
    "xgrammar", "xgrammar", "StructuralTag", "0.1.25",
    "wheels: xgrammar/__init__.py of 0.1.24 lacks it, 0.1.25 exports it",
)  # fmt: skip
STRUCTURAL_TAG_ITEM = NameFloor(
    "xgrammar", "xgrammar", "StructuralTagItem", "0.1.11",
    "wheels: xgrammar/__init__.py of 0.1.10 lacks it, 0.1.11 exports it",
)  # fmt: skip
MM_MXFP8 = NameFloor(
    "flashinfer-python", "flashinfer", "mm_mxfp8", "0.6.4",
    "notes; wheel flashinfer/__init__.py of 0.6.3 lacks it, 0.6.8.post1 exports it",
)  # fmt: skip


@dataclass(frozen=True)
class SglangNeeds:
    """Names an sglang release imports from its dependencies on start-up."""

    applies: SpecifierSet
    grammar: NameFloor | None  # imported by sglang/srt/constrained/xgrammar_backend.py
    mxfp8_on_blackwell: bool  # fp8_utils.py imports flashinfer.mm_mxfp8 on SM 10-12
    source: str


SGLANG_NEEDS: tuple[SglangNeeds, ...] = (
    SglangNeeds(SpecifierSet("==0.5.10"), STRUCTURAL_TAG_ITEM, True,
                "wheel sglang 0.5.10: xgrammar_backend.py, layers/quantization/fp8_utils.py"),
    SglangNeeds(SpecifierSet(">=0.5.11"), STRUCTURAL_TAG, True,
                "wheel sglang 0.5.11: xgrammar_backend.py, layers/quantization/fp8_utils.py"),
)  # fmt: skip
# sglang's is_blackwell_supported(): compute capability major 10, 11 or 12 (utils/common.py).
BLACKWELL_MAJORS = frozenset({10, 11, 12})


def sglang_needs(version: str | None) -> SglangNeeds | None:
    parsed = parse_version(version)
    if parsed is None:
        return None
    return next((n for n in SGLANG_NEEDS if parsed in n.applies), None)


@dataclass(frozen=True)
class WheelNeeds:
    """What the sglang wheel for a release range asks of the host."""

    applies: SpecifierSet
    python: SpecifierSet
    glibc: str | None  # manylinux_2_X -> "2.X"; None for a pure-Python wheel
    source: str


SGLANG_WHEELS: tuple[WheelNeeds, ...] = (
    WheelNeeds(SpecifierSet("==0.5.10"), SpecifierSet(">=3.10"), None,
               "wheel sglang-0.5.10-py3-none-any (Requires-Python >=3.10)"),
    WheelNeeds(SpecifierSet("==0.5.11"), SpecifierSet(">=3.10,<3.13"), "2.34",
               "notes: cp310-cp312 manylinux_2_34 wheels only"),
    WheelNeeds(SpecifierSet(">0.5.11,<0.5.23"), SpecifierSet(">=3.10"), "2.34",
               "issue 3: 0.5.11+ wheels are manylinux_2_34"),
    WheelNeeds(SpecifierSet(">=0.5.23"), SpecifierSet(">=3.11"), "2.34",
               "notes: 0.5.23 needs Python >= 3.11; issue 3: manylinux_2_34"),
)  # fmt: skip


def sglang_wheel(version: str | None) -> WheelNeeds | None:
    parsed = parse_version(version)
    if parsed is None:
        return None
    return next((w for w in SGLANG_WHEELS if parsed in w.applies), None)


@dataclass(frozen=True)
class DriverFloor:
    lane_major: int
    driver_major: int
    source: str


DRIVER_FLOORS: dict[int, DriverFloor] = {
    12: DriverFloor(12, 525, "CUDA compatibility guide: CUDA 12.x needs driver >= 525.60.13"),
    13: DriverFloor(13, 580, "notes: a CUDA 13 lane needs an R580 or newer driver"),
}


@dataclass(frozen=True)
class FlashinferJit:
    """FlashInfer's JIT on SM 12.x refuses CUDA older than this (field-facts error texts)."""

    sm_major: int = 12
    min_cuda: str = "12.9"
    source: str = (
        'notes: "SM 12.x requires CUDA >= 12.9"; CUDA from $CUDA_HOME/bin/nvcc, PATH, '
        "/usr/local/cuda, else torch.version.cuda"
    )


FLASHINFER_JIT = FlashinferJit()
SOUNDFILE = "soundfile"  # every sglang release checked pins soundfile==0.13.1


def all_sources() -> dict[str, str]:
    """Every floor and pin above with where it came from (for review and `doctor --json`)."""
    out: dict[str, str] = {f"sglang {v} pins": p.source for v, p in SGLANG_PINS.items()}
    out.update({f"{d} {v} torch": p.source for (d, v), p in KERNEL_TORCH_PINS.items()})
    for nf in (STRUCTURAL_TAG, STRUCTURAL_TAG_ITEM, MM_MXFP8):
        out[f"{nf.distribution} {nf.name} >= {nf.first}"] = nf.source
    out.update({f"sglang {w.applies} wheel": w.source for w in SGLANG_WHEELS})
    out.update({f"CUDA {k} driver": d.source for k, d in DRIVER_FLOORS.items()})
    out["flashinfer SM 12 CUDA"] = FLASHINFER_JIT.source
    return out
