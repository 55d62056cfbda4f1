"""Crash signatures against real log lines.

Lines in tests/data/signatures/*.json were produced by real packages failing (the lab's
stand-in server run locally with the real sglang/xgrammar/flashinfer wheels) or carry an
upstream package's own text; each names its source. The live tests below produce more lines
for real on this machine: a real dlopen of an extension module whose DT_NEEDED libraries are
missing, a real undefined c10 symbol, the real libcudart.so.13's error strings and asyncio's
real bind error.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from wheelcache import wheel

from ddtree_deploy.health.signatures import SIGNATURES, fill_remedy, match_line, scan

DATA = Path(__file__).parent / "data" / "signatures"
REAL = Path(__file__).parent / "data" / "real" / "sglang-0.5.11-h200"  # README.md: provenance
ROWS: list[dict[str, Any]] = [
    row for f in sorted(DATA.glob("*.json")) for row in json.loads(f.read_text())
]
CONTEXT = {"host": "ct200", "name": "sglang-ddtree", "venv": "/root/venv_sglang",
           "deployment": "ddtree", "port": 30001}
REAL_LOG_IDS = {"soundfile-missing", "ddtree-attention-backend"}  # whole real H200 logs below
LIVE_IDS = REAL_LOG_IDS | {"abi-missing-cuda-library", "abi-undefined-symbol",
                           "cuda-driver-missing", "gpu-unavailable", "cuda-oom", "port-in-use"}


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['expect_id']}-{i}" for i, r in enumerate(ROWS)])
def test_real_line_matches_its_signature(row: dict[str, Any]) -> None:
    assert row["source"].strip() and row["line"].strip()
    match = match_line(row["line"], CONTEXT)
    assert match is not None, row["line"]
    assert match.id == row["expect_id"]
    assert "ddtree-deploy" in match.remedy or "--" in match.remedy
    assert "{" not in match.remedy  # every placeholder was filled


def test_every_signature_is_tested_and_has_a_source() -> None:
    tested = {r["expect_id"] for r in ROWS} | LIVE_IDS
    for sig in SIGNATURES:
        assert sig.source and sig.diagnosis and sig.remedy
        assert sig.id in tested, f"{sig.id} has no real log line"
    assert len({s.id for s in SIGNATURES}) == len(SIGNATURES)


def test_remedies_name_the_fix_from_the_story() -> None:
    def remedy(sig_id: str) -> str:
        row = next(r for r in ROWS if r["expect_id"] == sig_id)
        match = match_line(row["line"], CONTEXT)
        assert match is not None
        return match.remedy

    assert remedy("ddtree-unknown-algorithm") == \
        "`ddtree-deploy payload deploy ct200 --venv /root/venv_sglang`"
    assert "--attention-backend triton" in remedy("flashinfer-sm12-guard")
    assert "--grammar-backend none" in remedy("xgrammar-no-structural-tag")
    assert "soundfile==0.13.1" in remedy("soundfile-missing")
    assert "`ddtree-deploy apply ct200`" in remedy("soundfile-missing")
    assert "--gpu N" in remedy("gpu-unavailable")
    assert "--mem-fraction-static" in remedy("cuda-oom")


def test_fill_remedy_marks_unknown_values() -> None:
    assert fill_remedy("`x {host} --venv {venv}`", {"host": "h", "venv": None}) == \
        "`x h --venv VENV`"


def test_scan_reports_each_signature_once_and_ignores_healthy_lines() -> None:
    lines = [
        "[2026-11-29 20:20:45] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16.",
        "INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
        "ModuleNotFoundError: No module named 'soundfile'",
        "ModuleNotFoundError: No module named 'soundfile'",
    ]
    found = scan(lines, CONTEXT)
    assert [m.id for m in found] == ["soundfile-missing"]
    assert found[0].line == lines[2]


# -- whole logs of real SGLang 0.5.11 on an H200 ---------------------------------------------


@pytest.mark.parametrize(("log", "expect"), [
    ("crash-no-soundfile.log", "soundfile-missing"),
    ("d1-no-backend.log", "ddtree-attention-backend"),
])
def test_real_h200_crash_logs_give_one_fatal_verdict(log: str, expect: str) -> None:
    found = scan((REAL / log).read_text().splitlines(), CONTEXT)
    assert [m.id for m in found] == [expect]
    assert found[0].fatal
    assert "{" not in found[0].remedy


def test_real_no_backend_log_names_the_backend_and_the_flag() -> None:
    (match,) = scan((REAL / "d1-no-backend.log").read_text().splitlines(), CONTEXT)
    assert match.groups == {"backend": "fa3"}
    assert match.line.startswith("ValueError: DDTREE full-tree verification")
    assert "service up ct200 ddtree --attention-backend triton" in match.remedy  # deployment


@pytest.mark.parametrize("log", ["nospec-server.log", "dflash-server.log",
                                 "ddtree-server-startup.log"])
def test_real_healthy_h200_logs_match_no_signature(log: str) -> None:
    # These start-ups print tracebacks (openai_harmony missing), FA3 import errors and a
    # client disconnect, none of which is a crash.
    lines = (REAL / log).read_text().splitlines()
    assert any("The server is fired up and ready to roll!" in line for line in lines)
    assert scan(lines, CONTEXT) == []


# -- lines produced for real on this machine ---------------------------------------------


def _last_line(code: str, cwd: Path) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    return out.stderr.strip().splitlines()[-1]


def _need_gcc() -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")


def test_real_dlopen_of_sgl_kernel_like_module_in_cu128_venv(tmp_path: Path) -> None:
    """An extension with sgl_kernel's DT_NEEDED head (libnvrtc.so.13 first) fails to load."""
    _need_gcc()
    from ddtree_lab.elfstub import SharedObject, compile_shared

    needed = ("libnvrtc.so.13", "libcudart.so.13", "libc.so.6")
    macros = (("MODULE_NAME", '"common_ops"'), ("PYINIT", "PyInit_common_ops"))
    so = SharedObject("pyext.c", needed, defines=macros, python_ext=True)
    compile_shared(so, tmp_path / "common_ops.abi3.so")
    line = _last_line("import common_ops", tmp_path)
    assert line == ("ImportError: libnvrtc.so.13: cannot open shared object file: "
                    "No such file or directory")
    match = match_line(line, CONTEXT)
    assert match is not None and match.id == "abi-missing-cuda-library"
    assert match.remedy == "`ddtree-deploy overlay --abi cu130 --to ct200 --venv /root/venv_sglang`"


def test_real_dlopen_without_driver_library(tmp_path: Path) -> None:
    _need_gcc()
    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has libcuda.so.1")
    from ddtree_lab.elfstub import SharedObject, compile_shared

    macros = (("MODULE_NAME", '"flash_ops"'), ("PYINIT", "PyInit_flash_ops"))
    so = SharedObject("pyext.c", ("libcuda.so.1", "libc.so.6"), defines=macros, python_ext=True)
    compile_shared(so, tmp_path / "flash_ops.abi3.so")
    line = _last_line("import flash_ops", tmp_path)
    assert "libcuda.so.1: cannot open shared object file" in line
    match = match_line(line, CONTEXT)
    assert match is not None and match.id == "cuda-driver-missing"


def test_real_undefined_c10_symbol(tmp_path: Path) -> None:
    _need_gcc()
    symbol = "_ZN3c1013MessageLoggerD1Ev"
    (tmp_path / "ext.c").write_text(
        f"extern void {symbol}(void);\nvoid standin_entry(void) {{ {symbol}(); }}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", "ext.so", "ext.c"], cwd=tmp_path,
                   check=True, capture_output=True)
    line = _last_line("import ctypes; ctypes.CDLL('./ext.so')", tmp_path)
    assert line.endswith(f"undefined symbol: {symbol}")
    match = match_line(line, CONTEXT)
    assert match is not None and match.id == "abi-undefined-symbol"


def _real_cudart(tmp_path: Path) -> ctypes.CDLL:
    with zipfile.ZipFile(wheel("nvidia-cuda-runtime", "13.0.96")) as zf:  # tests/wheels.toml
        member = next(n for n in zf.namelist() if n.endswith("/libcudart.so.13"))
        target = tmp_path / "libcudart.so.13"
        target.write_bytes(zf.read(member))
    return ctypes.CDLL(str(target))


def test_real_cudart_error_texts(tmp_path: Path) -> None:
    lib = _real_cudart(tmp_path)
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    lib.cudaGetErrorName.restype = ctypes.c_char_p
    busy = lib.cudaGetErrorString(46).decode()  # cudaErrorDevicesUnavailable
    name = lib.cudaGetErrorName(46).decode()
    oom = lib.cudaGetErrorString(2).decode()  # cudaErrorMemoryAllocation
    for line, expect in ((f"RuntimeError: CUDA error: {busy}", "gpu-unavailable"),
                         (f"torch.AcceleratorError: CUDA error: {busy} ({name})",
                          "gpu-unavailable"),
                         (f"RuntimeError: CUDA error: {oom}", "cuda-oom")):
        match = match_line(line, CONTEXT)
        assert match is not None and match.id == expect, line


def test_real_bind_error_as_uvicorn_logs_it() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]

        async def bind() -> str:
            loop = asyncio.get_running_loop()
            try:
                server = await loop.create_server(asyncio.Protocol, "127.0.0.1", port)
            except OSError as exc:
                return f"ERROR:    {exc}"  # uvicorn server.py: logger.error(exc)
            server.close()
            return ""

        line = asyncio.run(bind())
    assert "[Errno 98] error while attempting to bind on address" in line
    match = match_line(line, CONTEXT)
    assert match is not None and match.id == "port-in-use"
    assert "--port P" in match.remedy
