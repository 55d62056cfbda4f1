"""The probe's pure parsers on real outputs (tests/facts/<fact>/<case>.json, each saying where it
came from), plus malformed and empty ones; and the CUDA-major mapping on real readelf output."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.remote import facts_parse

FACTS = Path(__file__).parent / "facts"
REAL = Path(__file__).parent / "facts" / "real"  # copies of shared/fixtures/real (SOURCES.txt)


def _smi_gpus(case: dict[str, Any]) -> Any:
    return facts_parse.parse_smi_gpus(case["output"], case["query"])


def _smi_apps(case: dict[str, Any]) -> Any:
    return facts_parse.parse_smi_apps(case["output"], case["query"])


def _record(case: dict[str, Any]) -> Any:
    paths = facts_parse.parse_record_paths(case["output"])
    if "check" not in case:
        return paths
    got = {"count": len(paths), "first": paths[0], "last": paths[-1]}
    want = dict(item.split("=", 1) for item in case["check"].split(","))
    return got, {**want, "count": int(want["count"])}


PARSERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "nvidia_smi_gpus": _smi_gpus,
    "nvidia_smi_apps": _smi_apps,
    "driver_versions": lambda c: facts_parse.parse_driver_versions(c["output"]),
    "proc_driver_version": lambda c: facts_parse.parse_proc_driver_version(c["output"]),
    "proc_net_tcp": lambda c: facts_parse.parse_proc_net_tcp(c["output"]),
    "cgroup_unit": lambda c: facts_parse.parse_cgroup_unit(c["output"]),
    "show_units": lambda c: facts_parse.parse_show_units(c["output"]),
    "os_release": lambda c: facts_parse.parse_os_release(c["output"]).get("PRETTY_NAME"),
    "glibc": lambda c: facts_parse.parse_glibc(c["output"]),
    "meminfo": lambda c: facts_parse.parse_meminfo(c["output"]),
    "nvcc_version": lambda c: facts_parse.parse_nvcc_version(c["output"]),
    "torch_version_py": lambda c: facts_parse.parse_torch_version_py(c["output"]),
    "metadata": lambda c: facts_parse.parse_metadata(c["output"]),
    "record": _record,
}
CASES = sorted((p.parent.name, p.stem) for fact in PARSERS for p in (FACTS / fact).glob("*.json"))


def test_every_fact_has_real_and_broken_cases() -> None:
    by_fact: dict[str, list[str]] = {}
    for fact, case in CASES:
        by_fact.setdefault(fact, []).append(case)
    assert set(by_fact) == set(PARSERS)
    for fact, cases in by_fact.items():
        sources = [json.loads((FACTS / fact / f"{c}.json").read_text())["source"] for c in cases]
        assert all(sources), fact
        if fact not in ("record",):
            assert any("real" in s for s in sources), f"{fact}: no real capture"


@pytest.mark.parametrize(("fact", "case"), CASES, ids=[f"{f}/{c}" for f, c in CASES])
def test_parser_on_fixture(fact: str, case: str) -> None:
    data = json.loads((FACTS / fact / f"{case}.json").read_text(encoding="utf-8"))
    assert data["source"] and data["command"]
    got = PARSERS[fact](data)
    if fact == "record" and "check" in data:
        got, want = got
        assert got == want
    elif data.get("compare") == "subset":
        assert {k: got[k] for k in data["expected"]} == data["expected"]
    else:
        assert got == data["expected"]


def test_dead_gpu_is_dead_only_through_error_cells() -> None:
    ok = "0, GPU-a, NVIDIA H200, 143771, 0, 9.0, 00000000:00:06.0, 41, 0, P0, 580.159.04"
    na = ("0, GPU-a, NVIDIA H200, [N/A], [N/A], 9.0, 00000000:00:06.0, [N/A], [Not Supported], "
          "P0, 580.159.04")
    err = ("0, GPU-a, NVIDIA H200, 143771, 0, 9.0, 00000000:00:06.0, ERR!, [GPU requires reset], "
           "P0, 580.159.04")
    assert facts_parse.parse_smi_gpus(ok)[0]["dead"] is False
    assert facts_parse.smi_driver_version(ok) == facts_parse.smi_driver_version(err) == "580.159.04"
    no_driver = facts_parse.GPU_QUERY.replace(",driver_version", "")
    assert facts_parse.smi_driver_version(ok, query=no_driver) is None
    healthy_na = facts_parse.parse_smi_gpus(na)[0]
    assert (healthy_na["dead"], healthy_na["memory_total_mib"]) == (False, None)
    dead = facts_parse.parse_smi_gpus(err)[0]
    assert dead["dead"] is True
    assert dead["error"] == "temperature.gpu: ERR!; utilization.gpu: GPU requires reset"


# ---- CUDA majors from DT_NEEDED, on real readelf output ----------------------------------------


def _readelf_blocks(path: Path) -> list[list[str]]:
    """NEEDED lists of each `readelf -d` block in a capture (blocks start at 'Dynamic section'
    or at a '## file' line)."""
    blocks: list[list[str]] = [[]]
    for line in path.read_text().splitlines():
        if line.startswith(("## ", "Dynamic section")) and blocks[-1]:
            blocks.append([])
        found = re.search(r"\(NEEDED\)\s+Shared library: \[(.+)\]", line)
        if found:
            blocks[-1].append(found.group(1))
    return [b for b in blocks if b]


def _majors(needed: list[str]) -> list[int]:
    return sorted({m for m in map(facts_parse.cuda_major_of, needed) if m is not None})


def test_cuda_majors_of_real_libraries() -> None:
    torch_cu128 = _readelf_blocks(REAL / "torch-2.9.1-cu128-pypi/readelf-d-libtorch_cuda.txt")
    assert [_majors(b) for b in torch_cu128] == [[12]]  # cufft.so.11 is CUDA 12's
    kernel = _readelf_blocks(REAL / "sglang-kernel-0.4.2-pypi/readelf-d.txt")
    assert [_majors(b) for b in kernel] == [[13], [13], [13]]
    # torch 2.11.0+cu130's libtorch_cuda.so needs libcufft.so.12 and libcusparse.so.12 next to
    # libcudart.so.13: a naive "soname major = CUDA major" would call it mixed 12/13.
    cu130 = (REAL / "h200-cu130/elf.txt").read_text()
    cu130_needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", cu130)
    assert "libcufft.so.12" in cu130_needed
    assert _majors(cu130_needed) == [13]


@pytest.mark.parametrize(
    ("soname", "major", "is_cuda"),
    [
        ("libcudart.so.12", 12, True),
        ("libcudart.so.13", 13, True),
        ("libnvrtc.so.13", 13, True),
        ("libnvrtc.alt.so.13", 13, True),
        ("libnvrtc-builtins.so.13.0", 13, True),
        ("libcublasLt.so.12", 12, True),
        ("libnvJitLink.so.13", 13, True),
        ("libcufft.so.11", 12, True),
        ("libcusparse.so.12", None, True),  # CUDA 12 and 13 both ship .so.12
        ("libcurand.so.10", None, True),
        ("libcudnn.so.9", None, True),
        ("libcudnn_graph.so.9", None, True),
        ("libcuda.so.1", None, True),
        ("libc10_cuda.so", None, False),
        ("libtorch_cuda.so", None, False),
        ("libc.so.6", None, False),
        ("not a soname", None, False),
    ],
)
def test_soname_mapping(soname: str, major: int | None, is_cuda: bool) -> None:
    assert facts_parse.cuda_major_of(soname) == major
    assert facts_parse.is_cuda_lib(soname) is is_cuda


def test_canonical_names() -> None:
    assert facts_parse.canonical_name("Flashinfer_Python") == "flashinfer-python"
    assert facts_parse.canonical_name("sglang.kernel__x") == "sglang-kernel-x"


def test_systemctl_show_blocks() -> None:
    text = "Id=a.service\nMainPID=12\n\nId=b.service\nMainPID=0\n"
    assert facts_parse.parse_systemctl_show(text) == {
        "a.service": {"Id": "a.service", "MainPID": "12"},
        "b.service": {"Id": "b.service", "MainPID": "0"},
    }
    assert facts_parse.parse_systemctl_show("") == {}


def test_socket_inode() -> None:
    assert facts_parse.socket_inode("socket:[15413]") == 15413
    assert facts_parse.socket_inode("pipe:[15413]") is None
    assert facts_parse.socket_inode("/dev/null") is None


def test_torch_version_py_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    text = f"open({str(marker)!r}, 'w').write('x')\n__version__ = '2.11.0+cu130'\ncuda = '13.0'\n"
    assert facts_parse.parse_torch_version_py(text) == {"version": "2.11.0+cu130", "cuda": "13.0"}
    assert not marker.exists()


@pytest.mark.parametrize("case", ["h200_12fields_with_apps_header", "h200_15fields_header_units",
                                  "h200_15fields_noheader", "h200_busy_15fields"])
def test_driver_version_from_real_query_gpu_output(case: str) -> None:
    data = json.loads((FACTS / "nvidia_smi_gpus" / f"{case}.json").read_text())
    assert facts_parse.smi_driver_version(data["output"], data["query"]) == "580.159.04"
