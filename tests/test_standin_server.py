"""The lab's stand-in SGLang server, its import hook and the GPU0 wrapper.

Runs locally (no containers): temp venvs made with ``python3 -m venv`` and the
real wheels (sglang 0.5.10/0.5.11, flashinfer 0.6.3/0.6.8.post1, xgrammar
0.1.10/0.1.32, soundfile + cffi) of tests/wheels.toml (fetched by the test command before the
tiers). States are composed from per-package folders on PYTHONPATH on top of a
venv that holds only our distribution (its .pth must sit in site-packages).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wheelcache

from ddtree_lab import standin_dist

WHEELS = {  # a package state's folder -> the real wheel installed there (tests/wheels.toml)
    "sglang-0.5.11": ("sglang", "0.5.11"), "sglang-0.5.10": ("sglang", "0.5.10"),
    "sglang-0.5.17": ("sglang", "0.5.17"),
    "fi-0.6.3": ("flashinfer-python", "0.6.3"), "fi-0.6.8": ("flashinfer-python", "0.6.8.post1"),
    "xg-0.1.10": ("xgrammar", "0.1.10"), "xg-0.1.32": ("xgrammar", "0.1.32"),
    "soundfile": ("soundfile", "0.13.1"), "cffi": ("cffi", "2.0.0"),
}
PRO6000 = {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory_total_mib": 97887,
           "compute_cap": "12.0", "power_limit_w": 600}
A6000 = {"name": "NVIDIA RTX A6000", "memory_total_mib": 49140, "compute_cap": "8.6",
         "power_limit_w": 300}
GOOD = ["sglang-0.5.11", "sgl_kernel", "torch-cu128", "fi-0.6.8", "soundfile", "cffi", "xg-0.1.32"]
# torch/version.py as in the registry's torch 2.9.1 cu128 wheel (copied from
# /work/shared/fixtures/real/torch-2.9.1-cu128-pypi/version.py.txt, git_version line left out)
TORCH_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']
__version__ = '2.9.1+cu128'
debug = False
cuda: Optional[str] = '12.8'
hip: Optional[str] = None
xpu: Optional[str] = None
"""


def _need_python311() -> str:
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the real cp311 wheels need python 3.11")
    return sys.executable


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A venv with only ddtree-lab-standin, plus one folder per package state."""
    python = _need_python311()
    real = {key: wheelcache.wheel(*spec) for key, spec in WHEELS.items()}
    root = tmp_path_factory.mktemp("standin")
    wheel = standin_dist.build_standin_wheel(root / "dist")
    venv = root / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
           "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True)
    dirs: dict[str, Path] = {"venv": venv, "root": root}
    for key, whl in real.items():
        dirs[key] = root / "pkgs" / key
        subprocess.run([*pip, "--target", str(dirs[key]), str(whl)], check=True,
                       capture_output=True)
    # sgl_kernel: a minimal local package (the lab uses the real stand-in wheel).
    dirs["sgl_kernel"] = root / "pkgs" / "sgl_kernel"
    (dirs["sgl_kernel"] / "sgl_kernel").mkdir(parents=True)
    (dirs["sgl_kernel"] / "sgl_kernel" / "__init__.py").write_text("")
    # torch: only torch/version.py (the real cu128 text), read statically by the checks.
    dirs["torch-cu128"] = root / "pkgs" / "torch-cu128"
    (dirs["torch-cu128"] / "torch").mkdir(parents=True)
    (dirs["torch-cu128"] / "torch" / "version.py").write_text(TORCH_VERSION_PY)
    # models from host_files(), and a fake nvcc per CUDA release
    for path, content, _ in standin_dist.host_files("ct129"):
        if "/models/" in path:
            dest = root / "models" / path.split("/models/", 1)[1]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(content)
    for release in ("12.8", "12.9"):
        nvcc = root / f"cuda-{release}" / "bin" / "nvcc"
        nvcc.parent.mkdir(parents=True)
        nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, "
                        f"V{release}.0'\n")
        nvcc.chmod(0o755)
    return dirs


def _spec(root: Path, gpus: list[dict[str, object]]) -> Path:
    full = [{"index": i, "uuid": f"GPU-test-{i}", "pci_bus_id": f"00000000:{i + 1:02X}:00.0",
             "dead": False, **g} for i, g in enumerate(gpus)]
    path = root / f"spec-{abs(hash(json.dumps(full)))}.json"
    path.write_text(json.dumps({"driver_version": "580.95.05", "cuda_version": "13.0",
                                "gpus": full}))
    return path


def _env(lab: dict[str, Path], pkgs: list[str], spec: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "PYTHONPATH")}
    env.update(PYTHONPATH=os.pathsep.join(str(lab[p]) for p in pkgs),
               DDTREE_LAB_GPU_SPEC=str(spec), DDTREE_LAB_GPU_CLAIMS=str(lab["root"] / "claims"),
               CUDA_HOME=str(lab["root"] / "cuda-12.9"), PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


Run = subprocess.CompletedProcess[str]
Served = tuple[subprocess.Popen[str], int, Path]


def _launch(lab: dict[str, Path], env: dict[str, str], *args: str) -> Run:
    argv = [str(lab["venv"] / "bin/python"), "-m", "sglang.launch_server", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _models(lab: dict[str, Path]) -> list[str]:
    m = lab["root"] / "models"
    return ["--model-path", str(m / "Qwen3.6-27B"), "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", str(m / "Qwen3.6-27B-DFlash-b16")]


# -- the distribution and host files ------------------------------------------------------


def test_wheel_is_content_stable_with_correct_record(tmp_path: Path) -> None:
    a = standin_dist.build_standin_wheel(tmp_path / "a")
    b = standin_dist.build_standin_wheel(tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        names = zf.namelist()
        record = zf.read("ddtree_lab_standin-0.1.0.dist-info/RECORD").decode().splitlines()
        assert "ddtree_lab_standin.pth" in names
        assert "ddtree_lab_standin/launch_server.py" in names
        listed = {line.split(",")[0] for line in record}
        assert listed == set(names)
        for line in record:
            name, digest, size = line.split(",")
            if name.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            assert (name, digest, size) == tuple(
                standin_dist._record_line(name, zf.read(name)).split(","))


def test_host_files_models_tmpfiles_and_ct200_wrapper() -> None:
    common = {p: c for p, c, _ in standin_dist.host_files("ct129")}
    ct200 = {p: (c, m) for p, c, m in standin_dist.host_files("ct200")}
    assert "/etc/systemd/system/qwen-wrapper.service" not in common
    target = json.loads(common["/usr/share/ddtree-lab/models/Qwen3.6-27B/config.json"])
    draft = json.loads(common["/usr/share/ddtree-lab/models/Qwen3.6-27B-DFlash-b16/config.json"])
    ids = draft["dflash_config"]["target_layer_ids"]
    assert len(ids) * target["hidden_size"] == 25600
    assert all(0 <= i < target["num_hidden_layers"] for i in ids)
    tmpfiles = common["/etc/tmpfiles.d/ddtree-lab-models.conf"].decode()
    assert "C /dev/shm/Qwen3.6-27B - - - - /usr/share/ddtree-lab/models/Qwen3.6-27B" in tmpfiles
    unit, mode = ct200["/etc/systemd/system/qwen-wrapper.service"]
    assert mode == 0o644
    for line in ("Environment=CUDA_VISIBLE_DEVICES=0", "Restart=on-failure",
                 "ExecStart=/usr/bin/python3 /usr/local/lib/ddtree-lab/wrapper.py"):
        assert line.encode() in unit
    assert b"--port 30000" in unit
    assert "/usr/local/lib/ddtree-lab/python/ddtree_lab_standin/gpu.py" in ct200


# -- the hook -----------------------------------------------------------------------------


def test_hook_serves_lab_init_while_submodules_are_real(lab: dict[str, Path]) -> None:
    code = (
        "import sys, sglang, importlib.util\n"
        "import sglang.srt.speculative.spec_info as si\n"
        "print(sglang.__version__, si.__file__, 'numpy' in sys.modules, 'torch' in sys.modules)\n"
        "print(importlib.util.find_spec('sglang.launch_server').origin)\n"
        "print(si.SpeculativeAlgorithm.from_string('dflash').name)\n"
    )
    spec = _spec(lab["root"], [A6000])
    out = subprocess.run([str(lab["venv"] / "bin/python"), "-c", code], text=True,
                         capture_output=True, env=_env(lab, ["sglang-0.5.11"], spec), check=True)
    first, origin, algo = out.stdout.splitlines()
    version, spec_file, numpy_loaded, torch_loaded = first.split()
    assert version == "0.5.11"
    assert spec_file == str(lab["sglang-0.5.11"] / "sglang/srt/speculative/spec_info.py")
    assert (numpy_loaded, torch_loaded) == ("False", "False")
    assert origin.endswith("ddtree_lab_standin/launch_server.py")
    assert algo == "DFLASH"


def test_without_sglang_import_fails_normally(lab: dict[str, Path]) -> None:
    spec = _spec(lab["root"], [A6000])
    out = subprocess.run([str(lab["venv"] / "bin/python"), "-c", "import sglang"], text=True,
                         capture_output=True, env=_env(lab, [], spec))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == "ModuleNotFoundError: No module named 'sglang'"


# -- the checks, in order, from real states -----------------------------------------------

SM120, SM86 = [PRO6000], [A6000]
ORDER = [
    # (packages, gpus, extra flags, extra env, exit code, last stderr line)
    (["sglang-0.5.10"], SM120, [], {}, 2,
     "sglang serve: error: argument --speculative-algorithm: invalid choice: 'DFLASH' "
     "(choose from 'EAGLE', 'EAGLE3', 'NEXTN', 'STANDALONE', 'NGRAM')"),
    (["sglang-0.5.11"], SM120, [], {}, 1, "ModuleNotFoundError: No module named 'sgl_kernel'"),
    (["sglang-0.5.11", "sgl_kernel", "torch-cu128", "fi-0.6.3"], SM120, [], {}, 1,
     "ImportError: cannot import name 'mm_mxfp8' from 'flashinfer' ({fi-0.6.3}/flashinfer/"
     "__init__.py)"),
    # on SM 8.6 sglang never imports mm_mxfp8: the next missing piece shows instead
    (["sglang-0.5.11", "sgl_kernel", "torch-cu128", "fi-0.6.3"], SM86, [], {}, 1,
     "ModuleNotFoundError: No module named 'soundfile'"),
    (["sglang-0.5.11", "sgl_kernel", "torch-cu128", "fi-0.6.8"], SM120, [], {}, 1,
     "ModuleNotFoundError: No module named 'soundfile'"),
    (["sglang-0.5.11", "sgl_kernel", "torch-cu128", "fi-0.6.8", "soundfile", "cffi",
      "xg-0.1.10"], SM120, [], {}, 1,
     "ImportError: cannot import name 'StructuralTag' from 'xgrammar' ({xg-0.1.10}/xgrammar/"
     "__init__.py)"),
    (GOOD, SM120, [], {"CUDA_HOME": "", "PATH": "{cuda-12.8}/bin:/usr/bin:/bin"}, 1,
     "RuntimeError: FlashInfer requires GPUs with sm75 or higher"),
    (GOOD, SM120, [], {"CUDA_VISIBLE_DEVICES": "7"}, 1,
     "RuntimeError: No CUDA GPUs are available"),
    (GOOD, [A6000, {**A6000, "dead": True}], [], {"CUDA_VISIBLE_DEVICES": "1"}, 1,
     "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."),
    (GOOD, SM120, ["--model-path", "/nonexistent/Qwen3.6-27B"], {}, 1,
     "OSError: Incorrect path_or_model_id: '/nonexistent/Qwen3.6-27B'. Please provide either "
     "the path to a local folder or the repo_id of a model on the Hub."),
]


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


@pytest.mark.parametrize("case", range(len(ORDER)))
def test_failure_order_follows_real_state(lab: dict[str, Path], case: int) -> None:
    pkgs, gpus, flags, env_extra, rc, last = ORDER[case]
    fill = {k: str(v) for k, v in lab.items()} | {
        "cuda-12.8": str(lab["root"] / "cuda-12.8")}
    env = _env(lab, pkgs, _spec(lab["root"], gpus),
               **{k: _fill(v, fill) for k, v in env_extra.items()})
    if env.get("CUDA_HOME") == "":
        del env["CUDA_HOME"]
    out = _launch(lab, env, *_models(lab), *flags)
    assert out.returncode == rc, out.stderr[-2000:]
    assert out.stderr.rstrip().splitlines()[-1] == _fill(last, fill)


def test_sm12_guard_warns_first_and_triton_or_new_nvcc_avoid_it(lab: dict[str, Path]) -> None:
    spec = _spec(lab["root"], SM120)
    old = _env(lab, GOOD, spec, CUDA_VISIBLE_DEVICES="0",
               PATH=f"{lab['root'] / 'cuda-12.8' / 'bin'}:/usr/bin:/bin")
    del old["CUDA_HOME"]  # flashinfer then takes nvcc from PATH
    out = _launch(lab, old, *_models(lab))
    assert "flashinfer.jit: Failed to get device capability: SM 12.x requires CUDA >= 12.9." \
        in out.stderr
    # --attention-backend triton skips flashinfer: the run gets to the GPU check
    out = _launch(lab, {**old, "CUDA_VISIBLE_DEVICES": "5"}, *_models(lab),
                  "--attention-backend", "triton")
    assert out.stderr.rstrip().endswith("No CUDA GPUs are available")
    out = _launch(lab, {**old, "CUDA_VISIBLE_DEVICES": "5",
                        "CUDA_HOME": str(lab["root"] / "cuda-12.9")}, *_models(lab))
    assert out.stderr.rstrip().endswith("No CUDA GPUs are available")


def test_grammar_backend_none_skips_xgrammar(lab: dict[str, Path]) -> None:
    pkgs = [p for p in GOOD if p != "xg-0.1.32"] + ["xg-0.1.10"]
    env = _env(lab, pkgs, _spec(lab["root"], SM120), CUDA_VISIBLE_DEVICES="3")
    out = _launch(lab, env, *_models(lab), "--grammar-backend", "none")
    assert out.stderr.rstrip().endswith("No CUDA GPUs are available")


PLUGIN_FLAGS = ("--speculative-num-draft-tokens", "16", "--disable-overlap-schedule",
                "--page-size", "1", "--attention-backend", "triton")


def test_0517_flags_come_from_its_fields_and_ddtree_needs_the_plugin(lab: dict[str, Path]
                                                                     ) -> None:
    """0.5.17 declares its flags as ServerArgs fields (A[T, Arg(...)]): the plugin form's argv
    parses (no --speculative-ddtree-* flag exists), and without the plugin's entry point the
    real from_string refuses DDTREE; a real 0.5.11 flag is refused as 0.5.17 refuses it."""
    env = _env(lab, ["sglang-0.5.17", "torch-cu128"], _spec(lab["root"], SM120))
    models = _models(lab)
    models[3] = "DDTREE"
    out = _launch(lab, env, *models, *PLUGIN_FLAGS)
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.rstrip().splitlines()[-1] == \
        "ValueError: Unknown speculative algorithm name: DDTREE"
    out = _launch(lab, env, *models, *PLUGIN_FLAGS, "--speculative-ddtree-budget", "8")
    assert out.returncode == 2
    assert "unrecognized arguments: --speculative-ddtree-budget 8" in out.stderr
    out = _launch(lab, env, *_models(lab), *PLUGIN_FLAGS[:2])  # DFLASH is a builtin there
    assert out.stderr.rstrip().splitlines()[-1] == \
        "ModuleNotFoundError: No module named 'sgl_kernel'"


def _plugin(lab: dict[str, Path], tmp_path: Path) -> Path:
    """The plugin wheel built from payload/plugin/, installed into a folder of its own."""
    from ddtree_deploy.payload.plugin import build_wheel
    from ddtree_deploy.resources import data_path

    wheel = build_wheel(data_path("payload"), tmp_path / "wheel")
    plugin = tmp_path / "plugin"
    subprocess.run([str(lab["venv"] / "bin/python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", "--disable-pip-version-check", "--target", str(plugin),
                    str(wheel.path)], check=True, capture_output=True)
    return plugin


def test_0517_with_the_plugin_serves_ddtree_with_its_environment(lab: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """The whole plugin-form start on 0.5.17's real files: the argv the tool renders for
    0.5.17, the tree's settings in SGLANG_DDTREE_*, the server healthy and answering."""
    pkgs = ["sglang-0.5.17", "plugin", *[p for p in GOOD if p != "sglang-0.5.11"]]
    lab = {**lab, "plugin": _plugin(lab, tmp_path)}
    port = _free_port()
    env = _env(lab, pkgs, _spec(lab["root"], SM120), CUDA_VISIBLE_DEVICES="0",
               DDTREE_LAB_GPU_CLAIMS=str(tmp_path / "claims"), SGLANG_DDTREE_BUDGET="15",
               SGLANG_DDTREE_TOPK="8")
    models = _models(lab)
    models[3] = "DDTREE"
    argv = [str(lab["venv"] / "bin/python"), "-m", "sglang.launch_server", *models,
            *PLUGIN_FLAGS, "--port", str(port), "--mem-fraction-static", "0.8"]
    log = tmp_path / "server.log"  # a file, not a pipe: a pipe nobody reads fills and stalls it
    with log.open("w") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        status = 0
        while status != 200:  # until healthy or dead (pytest-timeout bounds a hang)
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError):  # not listening yet
                status = _get(f"http://127.0.0.1:{port}/health")[0]
            time.sleep(0.1)
        status, body = _get(f"http://127.0.0.1:{port}/v1/completions",
                            {"prompt": "Hello", "max_tokens": 12})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 12
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    out = log.read_text()
    assert "registered speculative algorithm DDTREE" in out
    assert "DDTREE ready: budget=15 topk=8" in out


def test_0517_with_the_plugins_entry_point_gets_past_the_algorithm(lab: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    """The plugin wheel built from payload/plugin/ installed beside sglang 0.5.17: its entry
    point registers DDTREE (the next check, sgl_kernel, is what fails); SGLANG_PLUGINS without
    it leaves DDTREE unknown, as load_plugins() would."""
    lab = {**lab, "plugin": _plugin(lab, tmp_path)}
    env = _env(lab, ["sglang-0.5.17", "torch-cu128", "plugin"], _spec(lab["root"], SM120))
    models = _models(lab)
    models[3] = "DDTREE"
    out = _launch(lab, env, *models, *PLUGIN_FLAGS)
    assert "registered speculative algorithm DDTREE" in out.stdout + out.stderr
    assert out.stderr.rstrip().splitlines()[-1] == \
        "ModuleNotFoundError: No module named 'sgl_kernel'"
    out = _launch(lab, {**env, "SGLANG_PLUGINS": "other"}, *models, *PLUGIN_FLAGS)
    assert out.stderr.rstrip().splitlines()[-1] == \
        "ValueError: Unknown speculative algorithm name: DDTREE"


def test_payload_half_applied_from_string_and_ddtree_flags(lab: dict[str, Path],
                                                           tmp_path: Path) -> None:
    """server_args.py accepting DDTREE while the installed enum lacks it -> from_string fails."""
    patched = tmp_path / "sglang-patched"
    subprocess.run(["cp", "-a", str(lab["sglang-0.5.11"]), str(patched)], check=True)
    sa = patched / "sglang/srt/server_args.py"
    text = sa.read_text()
    text = text.replace('choices=["DFLASH", "EAGLE",', 'choices=["DFLASH", "DDTREE", "EAGLE",')
    flag = '"--speculative-num-draft-tokens",'
    text = text.replace(flag, '"--speculative-ddtree-budget",\n            type=int,\n        )\n'
                        f'        parser.add_argument(\n            {flag}')
    sa.write_text(text)
    lab = {**lab, "sglang-patched": patched}
    env = _env(lab, ["sglang-patched"], _spec(lab["root"], SM120))
    models = _models(lab)
    models[3] = "DDTREE"
    out = _launch(lab, env, *models, "--speculative-ddtree-budget", "64")
    assert out.returncode == 1
    assert out.stderr.rstrip().splitlines()[-1] == \
        "ValueError: Unknown speculative algorithm name: DDTREE"
    assert "spec_info.py" in out.stderr  # the traceback runs through the real file
    env = _env(lab, ["sglang-0.5.11"], _spec(lab["root"], SM120))
    out = _launch(lab, env, *_models(lab), "--speculative-ddtree-budget", "64")
    assert out.returncode == 2
    assert "unrecognized arguments: --speculative-ddtree-budget 64" in out.stderr


def test_memory_held_by_another_live_process(lab: dict[str, Path], tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    claims.mkdir()
    holder = subprocess.Popen(["sleep", "60"])
    try:
        stat = Path(f"/proc/{holder.pid}/stat").read_text()
        start = stat[stat.rfind(")") + 2:].split()[19]
        (claims / f"{holder.pid}.json").write_text(json.dumps(
            {"pid": holder.pid, "gpu_index": 0, "used_mib": 86000, "process_name": "python3",
             "starttime": start}))
        env = _env(lab, GOOD, _spec(lab["root"], SM120), DDTREE_LAB_GPU_CLAIMS=str(claims),
                   CUDA_VISIBLE_DEVICES="0")
        out = _launch(lab, env, *_models(lab), "--mem-fraction-static", "0.8")
        assert out.stderr.rstrip().splitlines()[-1] == (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: mem_fraction_static=0.8")
    finally:
        holder.kill()
        holder.wait()


# -- a good venv serves --------------------------------------------------------------------


def _get(url: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture()
def server(lab: dict[str, Path], tmp_path: Path) -> Iterator[Served]:
    port = _free_port()
    claims = tmp_path / "claims"
    env = _env(lab, GOOD, _spec(lab["root"], SM120), DDTREE_LAB_GPU_CLAIMS=str(claims),
               CUDA_VISIBLE_DEVICES="0")
    argv = [str(lab["venv"] / "bin/python"), "-m", "sglang.launch_server", *_models(lab),
            "--port", str(port), "--mem-fraction-static", "0.8", "--attention-backend", "triton"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        yield proc, port, claims
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def test_good_venv_serves_and_claims_the_gpu(server: Served) -> None:
    proc, port, claims = server
    base = f"http://127.0.0.1:{port}"
    codes: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            codes.append(_get(f"{base}/health")[0])
        except OSError:
            time.sleep(0.1)
            continue
        if codes[-1] == 200:
            break
        time.sleep(0.1)
    assert codes[0] == 503 and codes[-1] == 200
    claim = json.loads((claims / f"{proc.pid}.json").read_text())
    assert claim["pid"] == proc.pid and claim["gpu_index"] == 0
    assert claim["used_mib"] == int(0.8 * PRO6000["memory_total_mib"])  # type: ignore[operator]
    status, body = _get(f"{base}/v1/completions", {"prompt": "Hello", "max_tokens": 12})
    first = json.loads(body)
    assert status == 200 and first["usage"]["completion_tokens"] == 12
    assert first["choices"][0]["finish_reason"] == "length"
    again = json.loads(_get(f"{base}/v1/completions", {"prompt": "Hello", "max_tokens": 12})[1])
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    t0 = time.monotonic()
    gen = json.loads(_get(f"{base}/generate",
                          {"text": "Hi", "sampling_params": {"max_new_tokens": 24}})[1])
    took = time.monotonic() - t0
    assert gen["meta_info"]["completion_tokens"] <= 24
    assert gen["meta_info"]["spec_accept_length"] > 1
    assert took >= gen["meta_info"]["completion_tokens"] / 200
    chat = json.loads(_get(f"{base}/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})[1])
    assert chat["usage"]["completion_tokens"] <= 4
    info = json.loads(_get(f"{base}/server_info")[1])
    assert info["version"] == "0.5.11" and info["speculative_algorithm"] == "DFLASH"
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1
    models = json.loads(_get(f"{base}/v1/models")[1])
    assert models["data"][0]["id"].endswith("Qwen3.6-27B")
    assert _get(f"{base}/model_info")[0] == 200 and _get(f"{base}/nope")[0] == 404
    assert _get(f"{base}/generate", {"text": 3})[0] == 400
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not (claims / f"{proc.pid}.json").exists()


# -- the GPU0 wrapper ----------------------------------------------------------------------


def test_wrapper_claims_gpu0_and_serves(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    for path, content, mode in standin_dist.host_files("ct200"):
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content)
        dest.chmod(mode)
    spec = _spec(tmp_path, [PRO6000, PRO6000])
    claims = tmp_path / "claims"
    port = _free_port()
    wrapper = root / "usr/local/lib/ddtree-lab/wrapper.py"
    env = {"PATH": "/usr/bin:/bin", "DDTREE_LAB_GPU_SPEC": str(spec),
           "DDTREE_LAB_GPU_CLAIMS": str(claims), "CUDA_VISIBLE_DEVICES": "0"}
    bad = subprocess.run(["python3", str(wrapper), "--port", str(port)], capture_output=True,
                         text=True, env={**env, "CUDA_VISIBLE_DEVICES": "7"}, timeout=30)
    assert bad.returncode == 1 and "No CUDA GPUs are available" in bad.stderr
    proc = subprocess.Popen(["python3", str(wrapper), "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if _get(f"http://127.0.0.1:{port}/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        models = json.loads(_get(f"http://127.0.0.1:{port}/v1/models")[1])
        assert models["data"][0]["id"] == "Qwen3.6-27B"
        claim = json.loads((claims / f"{proc.pid}.json").read_text())
        assert claim["gpu_index"] == 0 and claim["used_mib"] > 80000
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert not (claims / f"{proc.pid}.json").exists()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


# -- the stand-in against real SGLang 0.5.11 captures (tests/data/real/, README.md) ----------

REAL = Path(__file__).parent / "data" / "real" / "sglang-0.5.11-h200"
STANDIN_SRC = Path(__file__).resolve().parents[1] / "lab" / "ddtree_lab" / "standin_server"
STAMP = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] "
# Start-up and run lines the probe and bench read (a log file without systemd), as SGLang
# 0.5.11 prints them; each must be found in the real log named and in the stand-in's output.
STARTUP_LINES = {
    "weights begin": (r"Load weight begin\. avail mem=\d+\.\d\d GB$", "nospec"),
    "weights end": (r"Load weight end\. elapsed=\d+\.\d\d s, type=\w+, avail mem=\d+\.\d\d GB, "
                    r"mem usage=\d+\.\d\d GB\.$", "nospec"),
    "dflash runner": (r"Initialized DFLASH draft runner\. attention_backend=\w+, "
                      r"model=DFlashDraftModel, block_size=\d+, ", "dflash"),
    "dflash ready": (r"DFLASH draft runner ready\. mask_token=", "dflash"),
    "pool": (r"max_total_num_tokens=\d+, chunked_prefill_size=\d+, max_prefill_tokens=\d+, "
             r"max_running_requests=\w+, context_len=\d+, available_gpu_mem=\d+\.\d\d GB$",
             "nospec"),
    "process": (r"INFO:     Started server process \[\d+\]$", "nospec"),
    "startup complete": (r"INFO:     Application startup complete\.$", "nospec"),
    "uvicorn": (r"INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ \(Press CTRL\+C to quit\)$",
                "nospec"),
    "access": (r'INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" '
               r"(200 OK|503 Service Unavailable)$", "nospec"),
    "ready": (r"The server is fired up and ready to roll!$", "nospec"),
    "sigterm": (r"SIGTERM received\. signum=None frame=None\. Draining requests and shutting "
                r"down\.\.\.$", "nospec"),
}


def _shape(value: object) -> Any:
    """Keys (in order) and JSON types of a value; lists by their first item."""
    if isinstance(value, dict):
        return [(k, _shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", _shape(value[0])] if value else ["list"]
    return type(value).__name__


def _real(name: str) -> object:
    return json.loads((REAL / name).read_text())


@pytest.fixture()
def standin(monkeypatch: pytest.MonkeyPatch) -> object:
    """The stand-in's own modules, imported from the repository (no lab venv needed)."""
    monkeypatch.syspath_prepend(str(STANDIN_SRC))
    import ddtree_lab_standin.http as labhttp
    import ddtree_lab_standin.serving as serving
    import ddtree_lab_standin.speedmodel as speedmodel

    return type("M", (), {"http": labhttp, "serving": serving, "speed": speedmodel})


def _serve(standin: object, algorithm: str, *, tokens: bool, **speed: object) -> Iterator[str]:
    m: Any = standin
    state = m.serving.ServerState(
        args={"skip_tokenizer_init": tokens, "speculative_algorithm": algorithm,
              "max_running_requests": 8}, version="0.5.11", model_path="/tmp/smoke/target",
        served_model_name="/tmp/smoke/target", model_type="qwen3",
        architectures=["Qwen3ForCausalLM"], algorithm=algorithm, context_length=4096,
        skip_tokenizer_init=tokens, vocab_size=1024, warmup_s=0.0,
        speed=m.speed.SpeedModel(algorithm=algorithm, **speed))
    server = m.http.make_server("127.0.0.1", 0, m.serving.routes(state), access_log=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _post(url: str, body: object) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def test_token_id_generate_has_the_real_fields_and_types(standin: object) -> None:
    real_one = _real("greedy.json")
    real_batch = _real("ddtree-generate-2req.json")
    assert isinstance(real_one, list) and isinstance(real_batch, list)
    for base in _serve(standin, "DDTREE", tokens=True, block=8, budget=8, topk=4):
        status, _, body = _post(f"{base}/generate", {
            "input_ids": [5, 6, 7, 8, 9, 10],
            "sampling_params": {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}})
        assert status == 200
        one = json.loads(body)
        real = real_one[0]
        real["meta_info"]["cached_tokens_details"] = None  # dict or null in real answers
        assert _shape(one) == _shape(real)
        meta = one["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": 32}
        assert len(one["output_ids"]) == meta["completion_tokens"] == 32
        assert all(0 <= t < 1024 for t in one["output_ids"])
        assert meta["prompt_tokens"] == 6
        # tokenizer_manager.py's definitions, which the real answers satisfy too
        for m_ in (meta, real["meta_info"]):
            assert m_["spec_accept_length"] == m_["completion_tokens"] / m_["spec_verify_ct"]
            assert m_["spec_proposed_drafts"] == m_["spec_verify_ct"] * 8  # budget 8 + 1 - 1
            assert m_["spec_accept_rate"] == m_["spec_accepted_drafts"] / m_["spec_proposed_drafts"]
        assert meta["spec_accept_length"] > 1  # the stand-in's synthetic tree accepts drafts
        status, _, body = _post(f"{base}/generate", {
            "input_ids": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10]],
            "sampling_params": {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}})
        batch = json.loads(body)
        for item in real_batch:
            item["meta_info"]["cached_tokens_details"] = None
        assert status == 200 and _shape(batch) == _shape(real_batch) and len(batch) == 2
        assert [b["meta_info"]["prompt_tokens"] for b in batch] == [6, 4]
        # same prompt, same tokens (greedy and deterministic, as the real target)
        again = json.loads(_post(f"{base}/generate", {
            "input_ids": [5, 6, 7, 8, 9, 10],
            "sampling_params": {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}})[2])
        assert again["output_ids"] == one["output_ids"]
        status, _, body = _post(f"{base}/generate", {"text": "hello"})
        assert status == 400
        assert json.loads(body) == {"error": {"message": (
            "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. "
            "Please provide input_ids or re-initialize the engine with "
            "skip_tokenizer_init=False.")}}


def test_without_speculation_meta_info_has_no_spec_fields(standin: object) -> None:
    real = _real("greedy.json")
    assert isinstance(real, list)
    spec_keys = {k for k in real[0]["meta_info"] if k.startswith("spec_")}
    for base in _serve(standin, "NONE", tokens=True):
        out = json.loads(_post(f"{base}/generate", {
            "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}})[2])
        assert spec_keys.isdisjoint(out["meta_info"])
        assert set(out["meta_info"]) == set(real[0]["meta_info"]) - spec_keys


def _sse_chunks(body: bytes) -> list[str]:
    lines = body.decode().split("\n\n")
    assert lines[-1] == ""
    assert all(line.startswith("data: ") for line in lines[:-1])
    return [line[len("data: "):] for line in lines[:-1]]


@pytest.mark.parametrize("tokens", [True, False])
def test_streaming_is_sse_with_cumulative_output_and_done(standin: object, tokens: bool) -> None:
    real = _real("greedy.json")
    assert isinstance(real, list)
    for base in _serve(standin, "DFLASH", tokens=tokens, block=8):
        prompt: dict[str, object] = {"input_ids": [3, 4, 5]} if tokens else {"text": "Count:"}
        status, ctype, body = _post(f"{base}/generate", {
            **prompt, "stream": True,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})
        assert status == 200 and ctype == "text/event-stream"
        chunks = _sse_chunks(body)
        assert chunks[-1] == "[DONE]"
        outs = [json.loads(c) for c in chunks[:-1]]
        assert len(outs) > 1  # one chunk per decode round
        ids = [o["output_ids"] for o in outs]
        for before, after in zip(ids, ids[1:], strict=False):
            assert after[:len(before)] == before and len(after) > len(before)
        assert all(o["meta_info"]["finish_reason"] is None for o in outs[:-1])
        assert all("e2e_latency" not in o["meta_info"] for o in outs[:-1])
        last = outs[-1]
        assert last["meta_info"]["completion_tokens"] == len(last["output_ids"]) == 24
        want = real[0]["meta_info"].keys()
        assert list(last["meta_info"]) == list(want)
        assert ("text" in last) is not tokens
        if not tokens:
            assert len(last["text"].split()) == 24


def test_model_info_models_and_server_info_match_the_real_shapes(standin: object) -> None:
    real_info = _real("server_info.json")
    assert isinstance(real_info, dict)
    for base in _serve(standin, "DDTREE", tokens=True, block=8, budget=8, topk=4):
        assert _shape(json.loads(_get(f"{base}/model_info")[1])) == _shape(_real("model_info.json"))
        assert _shape(json.loads(_get(f"{base}/v1/models")[1])) == _shape(_real("v1_models.json"))
        info = json.loads(_get(f"{base}/server_info")[1])
        assert "avg_spec_accept_length" not in info["internal_states"][0]  # none measured yet
        _post(f"{base}/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 8}})
        info = json.loads(_get(f"{base}/server_info")[1])
        assert info["version"] == real_info["version"] == "0.5.11"
        assert info["skip_tokenizer_init"] is real_info["skip_tokenizer_init"] is True
        real_state = dict(_shape(real_info["internal_states"][0]))
        state = dict(_shape(info["internal_states"][0]))
        for key in ("last_gen_throughput", "memory_usage", "effective_max_running_requests_per_dp"):
            assert state[key] == real_state[key], key
        assert info["internal_states"][0]["avg_spec_accept_length"] > 1


def test_synthetic_speed_depends_on_budget_topk_and_concurrency(standin: object) -> None:
    m: Any = standin
    speed = m.speed.SpeedModel
    dflash, tree = speed("DFLASH", block=16), speed("DDTREE", block=16, budget=15, topk=8)
    key = "a prompt"
    assert tree.width == 16 and speed("DDTREE", block=16, budget=31, topk=8).width == 32
    assert speed("NONE").accept_length(False, key) == 1.0
    assert tree.accept_length(False, key) > dflash.accept_length(False, key) > 1
    assert tree.accept_length(True, key) < tree.accept_length(False, key)
    assert speed("DDTREE", block=16, budget=31, topk=8).accept_length(False, key) > \
        tree.accept_length(False, key)
    assert speed("DDTREE", block=16, budget=15, topk=2).accept_length(False, key) < \
        tree.accept_length(False, key)
    shadow = speed("DDTREE", block=16, budget=15, topk=8, shadow_linear=True)
    assert shadow.accept_length(False, key) == dflash.accept_length(False, key)
    assert shadow.round_seconds(1) > dflash.round_seconds(1)
    for model in (dflash, tree, speed("NONE")):
        assert model.round_seconds(8) > model.round_seconds(1)
    # the tree's per-request gain over DFlash shrinks as concurrency grows
    def rate(model: Any, batch: int) -> float:
        return float(model.accept_length(False, key) / model.round_seconds(batch))

    assert rate(tree, 1) / rate(dflash, 1) > rate(tree, 16) / rate(dflash, 16)
    assert "SYNTHETIC" in (m.speed.__doc__ or "")


def _startup_lines(lab: dict[str, Path], *args: str) -> list[str]:
    """Run the stand-in until ready, stop it with SIGTERM; its output lines."""
    port = _free_port()
    env = _env(lab, GOOD, _spec(lab["root"], SM120), CUDA_VISIBLE_DEVICES="0")
    argv = [str(lab["venv"] / "bin/python"), "-m", "sglang.launch_server", *args,
            "--host", "127.0.0.1", "--port", str(port), "--attention-backend", "triton",
            "--skip-tokenizer-init", "--max-running-requests", "8"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if _get(f"http://127.0.0.1:{port}/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        time.sleep(0.3)  # the ready line follows /health 200 within 0.1 s
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out.splitlines()


def test_startup_lines_are_those_of_real_sglang(lab: dict[str, Path]) -> None:
    real = {name: (REAL / f"{name}-server.log").read_text().splitlines()
            for name in ("nospec", "dflash")}
    ours = _startup_lines(lab, *_models(lab))
    for what, (pattern, source) in STARTUP_LINES.items():
        regex = re.compile(STAMP + pattern)
        assert any(regex.search(line) for line in real[source]), f"{what}: not in the real log"
        assert any(regex.search(line) for line in ours), f"{what}: not in {ours}"
    from ddtree_deploy.health.signatures import scan

    assert scan(ours) == []
