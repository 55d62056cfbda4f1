"""Lane files: the shipped lanes load and match as designed; bad ones give file:line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_deploy.errors import ConfigError, ExitCode
from ddtree_deploy.overlay.lanefile import (
    available_lanes,
    canonical_name,
    load_lane,
    load_lane_file,
)

GOOD = """\
lane: cu130
source:
  host: ct129
  venv: /root/ml-env
distributions:
  - torch
  - nvidia-cu*
  - sglang-kernel
required: [torch]
supersedes:
  - nvidia-*-cu12
checks:
  torch_cuda: "13.0"
  extension_cudart_major: 13
  imports: [sgl_kernel]
"""


def _write(tmp_path: Path, text: str, name: str = "cu130.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_lane_file(path)
    assert info.value.exit_code == ExitCode.USAGE
    return str(info.value)


def test_shipped_lanes_load_and_split_the_nvidia_wheels() -> None:
    assert {"cu128", "cu130"} <= set(available_lanes())
    cu130, cu128 = load_lane("cu130"), load_lane("cu128")
    assert cu130.source.host == "ct129" and cu130.source.venv == "/root/ml-env"
    assert cu130.checks.torch_cuda == "13.0" and cu130.checks.extension_cudart_major == 13
    assert "sgl_kernel" in cu130.checks.imports
    # Names from the real H200 host's pip freeze (shared/fixtures/real/h200-cu130/pip-freeze.txt).
    for name in ("torch", "triton", "torchvision", "nvidia-cublas", "nvidia-cuda-runtime",
                 "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-nvjitlink", "nvidia-nvtx",
                 "nvidia-cusparselt-cu13", "nvidia-nvshmem-cu13", "cuda-toolkit", "sglang-kernel"):
        assert cu130.includes(name), name
        assert not cu130.supersedes_name(name), name
    for name in ("nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12", "nvidia-nccl-cu12"):
        assert not cu130.includes(name) and cu130.supersedes_name(name), name
        assert cu128.includes(name) and not cu128.supersedes_name(name), name
    for name in ("nvidia-cuda-runtime", "nvidia-cudnn-cu13", "cuda-toolkit"):
        assert cu128.supersedes_name(name) and not cu128.includes(name), name
    for name in ("nvidia-ml-py", "numpy", "sglang", "flashinfer-python", "cupy-cuda13x"):
        assert not cu130.includes(name) and not cu130.supersedes_name(name), name
        assert not cu128.includes(name) and not cu128.supersedes_name(name), name
    # Names as dist-info folders spell them are matched in canonical form.
    assert cu130.includes("nvidia_cudnn_cu13") and cu130.includes("Torch")


def test_canonical_name_and_patterns_are_normalised(tmp_path: Path) -> None:
    assert canonical_name("Nvidia_CUDA.runtime") == "nvidia-cuda-runtime"
    lane = load_lane_file(_write(tmp_path, GOOD.replace("- sglang-kernel", "- SGLang_Kernel")))
    assert "sglang-kernel" in lane.distributions and lane.includes("sglang_kernel")


def test_from_overrides_are_validated(tmp_path: Path) -> None:
    lane = load_lane_file(_write(tmp_path, GOOD))
    moved = lane.with_source(host="ct130", venv="/opt/venv/")
    assert (moved.source.host, moved.source.venv) == ("ct130", "/opt/venv")
    assert lane.source.host == "ct129"  # the original is untouched
    with pytest.raises(ConfigError, match="--from-venv: expected an absolute path"):
        lane.with_source(venv="venv")
    with pytest.raises(ConfigError, match="--from: expected a host name"):
        lane.with_source(host="Bad Host")


def test_unknown_lane_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"no lane 'cu999' \(known lanes: .*cu128, cu130"):
        load_lane("cu999")
    with pytest.raises(ConfigError, match="no such file"):
        load_lane("/nonexistent/cu130.yaml")


# Each malformed file and the exact message (relative to the file's path) it must give.
MALFORMED: list[tuple[str, str, list[str]]] = [
    ("relative venv", GOOD.replace("venv: /root/ml-env", "venv: root/ml-env"),
     ["4: source.venv: expected an absolute path on the host, got 'root/ml-env'"]),
    ("tilde venv", GOOD.replace("venv: /root/ml-env", "venv: ~/ml-env"),
     ["4: source.venv: expected an absolute path on the host ('~' is not expanded for paths "
      "on a host), got '~/ml-env'"]),
    ("unquoted cuda version", GOOD.replace('torch_cuda: "13.0"', "torch_cuda: 13.0"),
     ["13: checks.torch_cuda: expected a CUDA version in quotes (YAML reads this as a number), "
      "got 13.0"]),
    ("major as text", GOOD.replace("extension_cudart_major: 13", 'extension_cudart_major: "13"'),
     ["14: checks.extension_cudart_major: expected an integer, got '13'"]),
    ("bad module", GOOD.replace("imports: [sgl_kernel]", "imports: [sgl-kernel]"),
     ["15: checks.imports[0]: expected a Python module name such as sgl_kernel, "
      "got 'sgl-kernel'"]),
    ("typo field", GOOD.replace("supersedes:", "supersede:"),
     ["10: supersede: unknown field (did you mean 'supersedes'?)"]),
    ("space in name", GOOD.replace("  - nvidia-cu*", "  - nvidia cu*"),
     ["7: distributions[1]: expected a distribution name or fnmatch pattern (letters, digits, "
      "'.', '_', '-', '*', '?', '[...]'), got 'nvidia cu*'"]),
    ("no distributions", GOOD.replace("  - torch\n  - nvidia-cu*\n  - sglang-kernel\n", "")
     .replace("distributions:", "distributions: []").replace("required: [torch]\n", ""),
     ["5: distributions: expected at least one distribution name or pattern"]),
    ("missing source", GOOD.replace("source:\n  host: ct129\n  venv: /root/ml-env\n", ""),
     ["1: source: required field is missing"]),
    ("supersedes what it installs", GOOD.replace("  - nvidia-*-cu12", "  - torch*"),
     ["11: supersedes[0]: 'torch*' matches torch, which the lane installs"]),
    ("required not in lane", GOOD.replace("required: [torch]", "required: [torch, triton]"),
     ["9: required[1]: 'triton' is not in the lane (distributions, exclude)"]),
    ("required pattern", GOOD.replace("required: [torch]", "required: [torch, 'nvidia-*']"),
     ["9: required[1]: 'nvidia-*': expected a distribution name, not a pattern"]),
    ("listed twice", GOOD.replace("  - sglang-kernel", "  - sglang-kernel\n  - SGLang_Kernel"),
     ["9: distributions[3]: 'sglang-kernel' is listed twice (first on line 8)"]),
    ("majors disagree", GOOD.replace("extension_cudart_major: 13", "extension_cudart_major: 12"),
     ["14: checks.extension_cudart_major: 12 disagrees with torch_cuda '13.0' (major 13)"]),
    ("lane name differs", GOOD.replace("lane: cu130", "lane: cu128"),
     ["1: lane: 'cu128' differs from the file name 'cu130.yaml'"]),
    ("duplicate key", GOOD + "lane: cu131\n",
     ["16: lane: duplicate key 'lane' (first given on line 1)"]),
    ("unbalanced bracket", GOOD.replace("  - nvidia-cu*", "  - nvidia-cu[12"),
     ["7: distributions[1]: unbalanced '[' ']' in pattern, got 'nvidia-cu[12'"]),
]


@pytest.mark.parametrize(("why", "text", "want"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_lane_files(tmp_path: Path, why: str, text: str, want: list[str]) -> None:
    path = _write(tmp_path, text)
    assert _error(path).splitlines() == [f"{path}:{w}" for w in want]


def test_several_problems_are_reported_at_once(tmp_path: Path) -> None:
    text = GOOD.replace("host: ct129", "host: 7").replace("venv: /root/ml-env", "venv: x")
    path = _write(tmp_path, text)
    assert _error(path).splitlines() == [
        f"{path}:3: source.host: expected a host name in quotes (YAML reads this as a number), "
        "got 7",
        f"{path}:4: source.venv: expected an absolute path on the host, got 'x'",
    ]


def test_yaml_syntax_error_and_non_mapping(tmp_path: Path) -> None:
    path = _write(tmp_path, "lane: cu130\nsource: [\n")
    assert _error(path).startswith(f"{path}:3:1: YAML syntax error")
    path = _write(tmp_path, "- torch\n")
    assert _error(path) == f"{path}:1: expected a mapping (an overlay lane), got a list"
