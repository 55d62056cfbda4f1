"""The whole probe, bundled into one script and run as `python3 - ARGS` on this machine against
throwaway venvs; its JSON must validate as facts.model.Facts, and a part that fails must
report its error while the others still work."""

from __future__ import annotations

import ast
import json
import os
import random
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hang_guard import kill_left, running, wait_none_running
from probe_venvs import (
    broken_objects,
    ddtree_spec_text,
    have_gcc,
    heavy_spec_text,
    kernel_cu12,
    make_venv,
    real_packages,
    sglang_tree,
    torch_cu130,
)

from ddtree_deploy.facts.model import Facts
from ddtree_deploy.remote.bundle import PARTS, probe_source

STANDIN_SMI = Path(__file__).resolve().parents[1] / "lab/ddtree_lab/standin/nvidia_smi.py"
pytestmark = pytest.mark.skipif(not have_gcc(), reason="needs gcc (scripts/setup.sh installs it)")


def run_probe(args: list[str], path_dirs: list[Path], env: dict[str, str] | None = None) -> Any:
    full_env = {"PATH": ":".join(str(p) for p in path_dirs), "HOME": "/nonexistent-home",
                "LANG": "C.UTF-8", **(env or {})}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-", *args],
        input=probe_source().encode(),
        capture_output=True,
        env=full_env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b"", proc.stderr.decode()
    data = json.loads(proc.stdout)
    Facts.model_validate(data)
    return data


def fake_smi(bin_dir: Path, spec: dict[str, Any], tmp: Path) -> dict[str, str]:
    """nvidia-smi on PATH = the lab's stand-in, reading `spec`."""
    bin_dir.mkdir(exist_ok=True)
    (tmp / "gpus.json").write_text(json.dumps(spec))
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN_SMI} "$@"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return {"DDTREE_LAB_GPU_SPEC": str(tmp / "gpus.json"), "DDTREE_LAB_GPU_CLAIMS": str(tmp / "c")}


CT129 = {
    "driver_version": "580.95.05",
    "cuda_version": "13.0",
    "gpus": [
        {"index": i, "name": "NVIDIA RTX A6000", "uuid": f"GPU-{i}1111111-2222-3333-4444-5555",
         "pci_bus_id": f"00000000:0{i + 1}:00.0", "memory_total_mib": 49140, "compute_cap": "8.6",
         "power_limit_w": 300, "dead": i == 1}
        for i in range(2)
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two venvs: a DDTree-capable one (cu130 torch, CUDA 12 kernel, broken .so files,
    new flashinfer/xgrammar) and a stock 0.5.11 one whose spec_info needs sglang."""
    root = tmp_path_factory.mktemp("host") / "root"
    good, sp = make_venv(root / "ml-env")
    torch_cu130(sp)
    kernel_cu12(sp)
    broken_objects(sp)
    sglang_tree(sp, ddtree_spec_text(), ddtree=True)
    real_packages(sp, "0.6.8.post1", "0.1.32")
    old, sp2 = make_venv(root / "venv_sglang", py="3.12")
    sglang_tree(sp2, heavy_spec_text(), False)
    real_packages(sp2, "0.6.3", "0.1.10")
    return {"good": good, "old": old}


@pytest.fixture()
def host(venvs: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    return {**venvs, "bin": tmp_path / "bin", "tmp": tmp_path}


def test_probe_on_fake_host(host: dict[str, Path]) -> None:
    env = fake_smi(host["bin"], CT129, host["tmp"])
    missing = host["tmp"] / "no-such-venv"
    args = ["--host-name", "ct129", "--venv", str(host["good"]), "--venv", str(host["old"])]
    data = run_probe([*args, "--venv", str(missing)], [host["bin"], Path("/usr/bin"), Path("/bin")],
                     env)  # fmt: skip
    facts = Facts.model_validate(data)
    assert facts.host == "ct129"
    # nvidia: GPU1 is dead with the error text, GPU0 fine
    assert facts.nvidia.present and facts.nvidia.error is None
    assert (facts.nvidia.driver_version, facts.nvidia.cuda_version) == ("580.95.05", "13.0")
    assert [(g.index, g.dead) for g in facts.nvidia.gpus] == [(0, False), (1, True)]
    assert facts.nvidia.gpus[1].error and "Unknown Error" in facts.nvidia.gpus[1].error
    assert facts.nvidia.gpus[0].compute_cap == "8.6"
    # the good venv
    good = facts.venv(str(host["good"]))
    assert good is not None and good.declared and good.python_version == "3.11.7"
    assert good.torch is not None
    assert (good.torch.version, good.torch.cuda, good.torch.dist_version) == (
        "2.11.0+cu130", "13.0", "2.11.0")  # fmt: skip
    assert good.distributions["sglang-kernel"] == "0.4.1"
    by_path = {e.path: e for e in good.extensions}
    torch_cuda = by_path["torch/lib/libtorch_cuda.so"]
    assert (torch_cuda.distribution, torch_cuda.cuda_majors) == ("torch", [13])
    assert torch_cuda.rpath[-1] == "$ORIGIN" and "libcudnn.so.9" in torch_cuda.needed
    kernel = by_path["sgl_kernel/common_ops.abi3.so"]
    assert (kernel.distribution, kernel.cuda_majors) == ("sglang-kernel", [12])
    assert "torch/lib/libc10.so" not in by_path  # needs no CUDA library
    errors = {p: by_path[p].error for p in by_path if p.startswith("broken/")}
    assert errors["broken/old32.so"] and "32-bit" in errors["broken/old32.so"]
    assert errors["broken/notelf.so"] == "not an ELF file"
    assert errors["broken/corrupt.so"]
    assert good.nvidia.cu13 and good.nvidia.other == ["cudnn"] and not good.nvidia.cu12_components
    sg = good.sglang
    assert sg is not None and sg.version == "0.5.11"
    assert sg.dflash_modules == ["dflash_info.py", "dflash_utils.py", "dflash_worker.py"]
    assert sg.ddtree_modules == ["ddtree_worker.py"]
    assert sg.knows_ddtree is True and sg.ddtree_is_dflash is True
    assert sg.spec_source == "runtime" and sg.spec_error is None
    assert "DDTREE" in sg.spec_algorithms and "EAGLE3" in sg.spec_algorithms
    assert sg.server_flags == ["--speculative-ddtree-budget", "--speculative-ddtree-topk"]
    assert good.names == {"flashinfer": ["mm_mxfp8"], "xgrammar": ["StructuralTag"]}
    assert good.error is None
    # the old venv: spec_info needs sglang -> loaded statically; old flashinfer/xgrammar
    old = facts.venv(str(host["old"]))
    assert old is not None and old.python_version == "3.12.7"
    assert old.sglang is not None and old.sglang.spec_source == "static"
    assert "ModuleNotFoundError" in (old.sglang.spec_runtime_error or "")
    assert old.sglang.spec_algorithms == [
        "DFLASH",
        "EAGLE",
        "EAGLE3",
        "STANDALONE",
        "NGRAM",
        "NONE",
    ]
    assert old.sglang.knows_ddtree is False and old.sglang.ddtree_is_dflash is False
    assert old.sglang.ddtree_modules == [] and old.sglang.server_flags == []
    assert old.names == {"flashinfer": [], "xgrammar": []}
    # the missing venv reports itself, nothing else breaks
    gone = facts.venv(str(missing))
    assert gone is not None and not gone.exists and "no such directory" in (gone.error or "")
    # host part
    assert facts.host_info.error is None and facts.host_info.cpu_count
    assert facts.host_info.python == ".".join(map(str, sys.version_info[:3]))
    assert facts.host_info.disks and facts.host_info.disks[0].path == "/"


def test_probe_without_nvidia_smi_or_systemctl(host: dict[str, Path]) -> None:
    empty = host["tmp"] / "empty-bin"
    empty.mkdir()
    data = run_probe(["--venv", str(host["good"])], [empty])
    facts = Facts.model_validate(data)
    assert not facts.nvidia.present and facts.nvidia.gpus == []
    assert facts.nvidia.error == "nvidia-smi --query-gpu: nvidia-smi: not found"
    assert facts.services.error and "systemctl" in facts.services.error
    assert facts.services.uv is None
    venv = facts.venv(str(host["good"]))
    assert venv is not None and venv.torch is not None and venv.torch.cuda == "13.0"


def test_cuda_version_from_libcuda_spares_the_summary_table(host: dict[str, Path]) -> None:
    """With libcuda loadable, the CUDA version comes from cuDriverGetVersion (the lab's
    stand-in libcuda answers as a driver speaking 12.8 here) and the driver version from the
    GPU query: nvidia-smi is called twice, never for its summary table."""
    from ddtree_lab.standin_wheels import build_libcuda

    env = fake_smi(host["bin"], CT129, host["tmp"])
    calls = host["tmp"] / "smi-calls"
    smi = host["bin"] / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n' + smi.read_text().split("\n", 1)[1])
    libs = host["tmp"] / "driver-libs"
    libs.mkdir()
    build_libcuda(libs / "libcuda.so.1", driver_api=12080)
    facts = Facts.model_validate(run_probe(
        ["--venv", str(host["good"])], [host["bin"], Path("/usr/bin"), Path("/bin")],
        {**env, "LD_LIBRARY_PATH": str(libs)}))
    assert (facts.nvidia.driver_version, facts.nvidia.cuda_version) == ("580.95.05", "12.8")
    assert facts.nvidia.error is None and len(facts.nvidia.gpus) == 2
    made = calls.read_text().splitlines()
    assert len(made) == 2 and all(c.startswith("--query-") for c in made)
    calls.unlink()
    without = Facts.model_validate(run_probe([], [host["bin"], Path("/usr/bin"), Path("/bin")],
                                             env))  # no libcuda: the table says 13.0
    assert (without.nvidia.driver_version, without.nvidia.cuda_version) == ("580.95.05", "13.0")
    assert "" in calls.read_text().splitlines()  # the plain `nvidia-smi` call


def test_a_stuck_nvml_leaves_the_rest_of_the_probe(host: dict[str, Path]) -> None:
    """NVML that hangs (the lab's libnvidia-ml told to take 600 s, as a driver stuck on a
    failed GPU can): the probe answers after its 5 s bound with every other part, and the child
    left behind holds none of the probe's output open (else run_probe would wait for it, past
    its own 60 s limit)."""
    from ddtree_lab.standin_wheels import build_libnvml

    env = fake_smi(host["bin"], CT129, host["tmp"])
    libs = host["tmp"] / "driver-libs"
    libs.mkdir()
    build_libnvml(libs / "libnvidia-ml.so.1")
    try:
        facts = Facts.model_validate(run_probe(
            ["--venv", str(host["good"])], [host["bin"], Path("/usr/bin"), Path("/bin")],
            {**env, "LD_LIBRARY_PATH": str(libs), "DDTREE_LAB_NVML_HANG": "600"}))
        assert facts.nvidia.source == "nvml" and not facts.nvidia.present
        assert facts.nvidia.error == "NVML did not answer within 5s"
        venv = facts.venv(str(host["good"]))
        assert venv is not None and venv.torch is not None and venv.torch.cuda == "13.0"
        normal = Facts.model_validate(run_probe(
            [], [host["bin"], Path("/usr/bin"), Path("/bin")],
            {**env, "LD_LIBRARY_PATH": str(libs)}))
        assert normal.nvidia.source == "nvml" and normal.nvidia.gpus[1].dead
    finally:
        kill_left(running(str(host["good"])))  # the probe's child left behind in nvmlInit


def test_nvidia_smi_failing_entirely(host: dict[str, Path]) -> None:
    env = fake_smi(host["bin"], CT129, host["tmp"])
    env["DDTREE_LAB_GPU_SPEC"] = str(host["tmp"] / "absent.json")  # "couldn't communicate"
    facts = Facts.model_validate(run_probe([], [host["bin"], Path("/usr/bin")], env))
    assert not facts.nvidia.present
    assert (
        facts.nvidia.error and "couldn't communicate with the NVIDIA driver" in facts.nvidia.error
    )


def test_hanging_nvidia_smi_is_bounded(host: dict[str, Path]) -> None:
    host["bin"].mkdir()
    smi = host["bin"] / "nvidia-smi"
    token = f"{600 + random.random():.6f}"  # far past run_probe's own 60 s limit
    smi.write_text(f"#!/bin/sh\nexec sleep {token}\n")
    smi.chmod(0o755)
    try:
        facts = Facts.model_validate(run_probe([], [host["bin"], Path("/usr/bin"), Path("/bin")]))
        assert facts.nvidia.error and "did not finish within 5s" in facts.nvidia.error
        wait_none_running(f"sleep {token}", "the hanging nvidia-smi")  # killed, not left
    finally:
        kill_left(running(f"sleep {token}"))


def test_discover_finds_venvs_under_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_deploy.remote import facts as host_facts

    root = tmp_path / "root"
    declared, _ = make_venv(root / "ml-env")
    nested, _ = make_venv(root / "proj" / ".venv")
    hidden, _ = make_venv(root / ".uv-env")
    too_deep, _ = make_venv(root / "a" / "b" / "venv")
    (root / "not-a-venv").mkdir()
    roots = (str(root), str(tmp_path / "absent"))
    assert host_facts.discover_venvs(roots) == [str(hidden), str(declared), str(nested)]
    monkeypatch.setattr(host_facts, "DISCOVER_ROOTS", roots)
    data = host_facts.gather([str(declared) + "/"], True, "x")
    assert [(v["path"], v["declared"]) for v in data["venvs"]] == [
        (str(declared), True), (str(hidden), False), (str(nested), False)]  # fmt: skip
    assert str(too_deep) not in [v["path"] for v in data["venvs"]]


def test_one_part_raising_does_not_sink_the_others(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddtree_deploy.remote import facts as host_facts

    def boom(*_: object) -> None:
        raise RuntimeError("layout exploded")

    monkeypatch.setattr(host_facts, "nvidia_layout", boom)
    monkeypatch.setattr(host_facts, "host_info", boom)
    data = host_facts.gather([str(host["good"])], False, "x")
    facts = Facts.model_validate(data)
    assert "RuntimeError: layout exploded" in (facts.host_info.error or "")
    venv = facts.venvs[0]
    assert venv.error and venv.error.startswith("nvidia: RuntimeError: layout exploded")
    assert venv.torch is not None and venv.sglang is not None and venv.sglang.knows_ddtree


# ---- the bundle ---------------------------------------------------------------------------------


def test_bundle_is_one_stdlib_script_for_python_38() -> None:
    source = probe_source()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    assert "ddtree_deploy" not in source.replace("ddtree-deploy", "")
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    dupes = {n for n in names if names.count(n) > 1}
    assert not dupes, f"a name defined in two parts would be shadowed: {dupes}"
    for api in ("removeprefix", "removesuffix", "functools.cache", "strict=", "match "):
        assert api not in source, f"{api} is newer than Python 3.8"
    assert len(PARTS) == len({p for p in PARTS}) and source.count("# ==== ") == len(PARTS)


def test_probe_modules_import_without_side_effects() -> None:
    code = (
        "import sys, ddtree_deploy.remote.facts as p; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1], env={**os.environ})  # fmt: skip
    assert out.stdout.strip() == "[]"


def test_bad_arguments_give_usage_not_traceback() -> None:
    proc = subprocess.run([sys.executable, "-", "--no-such-flag"], input=probe_source().encode(),
                          capture_output=True, timeout=30, check=False)  # fmt: skip
    assert proc.returncode == 2
    assert b"Traceback" not in proc.stderr and b"unrecognized arguments" in proc.stderr


def test_the_extension_walk_keeps_its_time_budget(tmp_path: Path) -> None:
    from ddtree_deploy.remote.facts_venv import scan_extensions, shared_objects

    sp = tmp_path / "site-packages"
    for rel in ("a/x.so", "a/b/y.so.1", "nvidia/cu13/lib/libcudart.so.13", "a/__pycache__/z.so",
                "c.dist-info/w.so", "a/b/readme.txt"):
        (sp / rel).parent.mkdir(parents=True, exist_ok=True)
        (sp / rel).write_bytes(b"not an ELF file")
    (sp / "a" / "link.so").symlink_to(sp / "a" / "x.so")
    assert shared_objects(str(sp)) == (["a/b/y.so.1", "a/x.so"], True)
    entries, problem = scan_extensions(str(sp), {"a/x.so": "pkg"})
    assert problem is None
    assert [(e["path"], e["distribution"], bool(e.get("error"))) for e in entries] == [
        ("a/b/y.so.1", None, True), ("a/x.so", "pkg", True)]  # fmt: skip
    assert shared_objects(str(sp), deadline=time.monotonic() - 1) == ([], False)
    entries, problem = scan_extensions(str(sp), {}, budget_s=0.0)
    assert entries == [] and problem == "extension scan stopped after 0s (partial list)"
