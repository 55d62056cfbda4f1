"""The lab's stand-in nvidia-smi, checked against real R580 captures (tests/facts/nvidia_smi/).

The script runs as a subprocess, with a temporary GPU spec and claims folder, as it does in the
lab containers. Real processes (`sleep`) hold the claims and are ended by PID.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ddtree_lab import provision

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "lab" / "ddtree_lab" / "standin"
SCRIPT = STANDIN / "nvidia_smi.py"
FACTS = Path(__file__).resolve().parent / "facts" / "nvidia_smi"
UUID_BUSY = "GPU-683f45df-28e7-86c0-004d-046e140e4ce4"  # the GPU of the 15-field and busy captures
UUID_IDLE = "GPU-a30cf273-2275-f5b6-a170-a20cf93ed3f8"  # the GPU of query-gpu.csv and the XML
DATE_LINE = re.compile(r"^[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}$")
FIELDS_15 = ("index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,compute_cap,"
             "driver_version,pci.bus_id,temperature.gpu,power.draw,persistence_mode,pstate,"
             "mig.mode.current")
VOLATILE = {"temperature.gpu", "power.draw"}


def fact(name: str) -> str:
    return (FACTS / name).read_text()


def section(text: str, start: str, end: str | None) -> str:
    body = text.split(start + "\n", 1)[1]
    return body.split(end + "\n", 1)[0] if end else body


def h200(uuid: str = UUID_BUSY, **extra: Any) -> dict[str, Any]:
    gpu = {"index": 0, "name": "NVIDIA H200", "uuid": uuid, "pci_bus_id": "00000000:00:06.0",
           "memory_total_mib": 143771, "compute_cap": "9.0", "power_limit_w": 700, "dead": False,
           "ecc": "0", "mig_mode": "Disabled", "temperature_c": 36, "power_draw_w": 128.58}
    gpu.update(extra)
    return {"driver_version": "580.159.04", "cuda_version": "13.0", "gpus": [gpu]}


def ct129() -> dict[str, Any]:
    def a6000(index: int, dead: bool) -> dict[str, Any]:
        return {"index": index, "name": "NVIDIA RTX A6000",
                "uuid": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
                "pci_bus_id": f"00000000:0{index + 1}:00.0", "memory_total_mib": 49140,
                "compute_cap": "8.6", "power_limit_w": 300, "dead": dead, "fan_percent": 30}
    return {"driver_version": "580.95.05", "cuda_version": "13.0",
            "gpus": [a6000(0, False), a6000(1, True)]}


class Lab:
    """A spec file and claims folder in tmp_path, and a runner for the script."""

    def __init__(self, tmp: Path) -> None:
        self.spec, self.claims = tmp / "gpus.json", tmp / "claims"

    def write(self, spec: dict[str, Any]) -> Lab:
        self.spec.write_text(json.dumps(spec))
        return self

    def env(self) -> dict[str, str]:
        return {**os.environ, "DDTREE_LAB_GPU_SPEC": str(self.spec),
                "DDTREE_LAB_GPU_CLAIMS": str(self.claims)}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(SCRIPT), *args], env=self.env(),
                              capture_output=True, text=True, timeout=30, check=False)

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stderr == ""
        return done.stdout


def load_module() -> ModuleType:
    """Import the stand-in's claims part by path (not registered in sys.modules)."""
    spec = importlib.util.spec_from_file_location("smi_claims_standin", STANDIN / "smi_claims.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def lab(tmp_path: Path) -> Lab:
    return Lab(tmp_path)


@pytest.fixture()
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, 9)
    proc.wait()


def test_script_is_a_standalone_python3_script() -> None:
    assert SCRIPT.read_text().startswith("#!/usr/bin/python3\n")
    parts = {name.removesuffix(".py") for name in provision.SMI_MODULES}
    for name in provision.SMI_MODULES:  # stdlib and its own parts only, from its own folder
        text = (STANDIN / name).read_text()
        found = {m.group(1).lstrip(".").split(".")[0]
                 for m in re.finditer(r"^\s*(?:import|from) (\S+)", text, re.M)}
        assert found <= set(sys.stdlib_module_names) | parts, name
        assert "stand-in" in text.split('"""')[1], name


def test_import_does_no_work(tmp_path: Path) -> None:
    """Imported as the launcher imports it (its folder on sys.path) and as a package module."""
    env = {**os.environ, "DDTREE_LAB_GPU_SPEC": str(tmp_path / "absent.json"),
           "DDTREE_LAB_GPU_CLAIMS": str(tmp_path / "claims")}
    for code in (f"import sys; sys.path.insert(0, {str(STANDIN)!r}); import nvidia_smi as m; "
                 "print(callable(m.main), callable(m.write_claim))",
                 "from ddtree_lab.standin import nvidia_smi as m; "
                 "print(callable(m.main), callable(m.write_claim))"):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=30, check=False)
        assert (done.returncode, done.stdout, done.stderr) == (0, "True True\n", "")
    assert not (tmp_path / "claims").exists()


def test_the_labs_files_run_as_the_script_does(lab: Lab, tmp_path: Path,
                                              sleeper: subprocess.Popen[bytes]) -> None:
    """What provision installs in a container (the modules and the launcher) is the whole
    stand-in: run from a folder holding only those files, it prints what the script prints."""
    root = tmp_path / "root"
    files = provision.smi_files()
    assert {path for path, _, _ in files} == {
        *(f"{provision.SMI_LIB}/{name}" for name in provision.SMI_MODULES), "/usr/bin/nvidia-smi"}
    for path, content, mode in files:
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content.replace(provision.SMI_LIB.encode(),
                                         str(root / provision.SMI_LIB.lstrip("/")).encode()))
        dest.chmod(mode)
    assert len(list((root / provision.SMI_LIB.lstrip("/")).iterdir())) == len(provision.SMI_MODULES)
    lab.write(ct129())
    load_module().write_claim(0, 6242, "python3", claims_dir=str(lab.claims), pid=sleeper.pid)
    for args in ([], ["-L"], ["-q", "-x"], ["--query-gpu=index,memory.used", "--format=csv"],
                 ["--query-compute-apps=pid,used_memory", "--format=csv"], ["-r", "-i", "1"],
                 ["--bogus"]):
        launched = subprocess.run([sys.executable, "-S", str(root / "usr/bin/nvidia-smi"), *args],
                                  env=lab.env(), capture_output=True, text=True, timeout=30,
                                  check=False)
        script = lab.run(*args)
        assert launched.returncode == script.returncode, args
        assert launched.stderr == script.stderr == "", args
        strip = re.compile(r"^.*\d\d:\d\d:\d\d \d{4}.*$", re.M)  # the date lines
        assert strip.sub("", launched.stdout) == strip.sub("", script.stdout), args
        assert launched.stdout.count("\n") == script.stdout.count("\n") > 0, args


def test_idle_table_reproduces_the_real_capture(lab: Lab) -> None:
    real = fact("nvidia-smi.txt").splitlines()
    ours = lab.write(h200(temperature_c=36, power_draw_w=128.58)).ok().splitlines()
    assert DATE_LINE.match(real[0]) and DATE_LINE.match(ours[0])
    assert ours[1:] == real[1:]


def test_busy_table_reproduces_the_real_capture(lab: Lab, sleeper: subprocess.Popen[bytes]) -> None:
    real = section(fact("busy-gpu-port30000.txt"), "---plain", "---query-gpu while busy")
    lab.write(h200(temperature_c=43, power_draw_w=123.56))
    load_module().write_claim(0, 6242, "python3", claims_dir=str(lab.claims), pid=sleeper.pid)
    ours = lab.ok().splitlines()
    real_lines = real.splitlines()
    assert DATE_LINE.match(ours[0])
    assert len(ours) == len(real_lines)
    for mine, theirs in zip(ours[1:], real_lines[1:], strict=True):
        if " 425 " in theirs:  # the process row: the PID differs, right-aligned at the same column
            assert theirs.index("425") + 3 == mine.index(str(sleeper.pid)) + len(str(sleeper.pid))
            mine = mine.replace(str(sleeper.pid), "X").replace(" ", "")
            theirs = theirs.replace("425", "X").replace(" ", "")
        assert mine == theirs


def test_query_gpu_matches_real_header_and_fields(lab: Lab) -> None:
    lab.write(h200())
    for fmt, name in (("csv", "query-gpu-15fields-header.csv.txt"),
                      ("csv,noheader,nounits", "query-gpu-15fields-noheader-nounits.csv.txt")):
        real = fact(name).splitlines()
        ours = lab.ok(f"--query-gpu={FIELDS_15}", f"--format={fmt}").splitlines()
        assert len(ours) == len(real)
        if fmt == "csv":
            assert ours[0] == real[0]
        for field, mine, theirs in zip(FIELDS_15.split(","), ours[-1].split(", "),
                                       real[-1].split(", "), strict=True):
            if field in VOLATILE:
                assert re.sub(r"[\d.]+", "N", mine) == re.sub(r"[\d.]+", "N", theirs), field
            else:
                assert mine == theirs, field


def test_query_gpu_12_fields_and_empty_compute_apps(lab: Lab) -> None:
    real = fact("query-gpu.csv.txt").splitlines()
    lab.write(h200(uuid=UUID_IDLE))
    fields = ",".join(FIELDS_15.split(",")[:12])
    ours = lab.ok(f"--query-gpu={fields}", "--format=csv").splitlines()
    assert ours[0] == real[0]
    assert ours[1].split(", ")[:10] == real[1].split(", ")[:10]
    apps = lab.ok("--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv")
    assert apps.splitlines() == real[2:]


def test_busy_queries_match_real(lab: Lab, sleeper: subprocess.Popen[bytes]) -> None:
    text = fact("busy-gpu-port30000.txt")
    lab.write(h200(temperature_c=43, power_draw_w=123.56))
    load_module().write_claim(0, 6242, "python3", claims_dir=str(lab.claims), pid=sleeper.pid)
    fields = "pid,process_name,used_memory,gpu_uuid"
    raw = lab.ok(f"--query-compute-apps={fields},gpu_bus_id", "--format=csv,noheader,nounits")
    assert raw == section(text, "pid=425", "---header").replace("425", str(sleeper.pid))
    with_units = lab.ok(f"--query-compute-apps={fields}", "--format=csv")
    assert with_units == section(text, "---header", "---plain").replace("425,", f"{sleeper.pid},")
    real = section(text, "---query-gpu while busy", "---ss -ltnp").strip().split(", ")
    ours = lab.ok(f"--query-gpu={FIELDS_15}", "--format=csv,noheader,nounits").strip().split(", ")
    for field, mine, theirs in zip(FIELDS_15.split(","), ours, real, strict=True):
        if field == "memory.free":  # the real driver's byte rounding: documented, at most 1 MiB
            assert abs(int(mine) - int(theirs)) <= 1
        elif field not in VOLATILE:
            assert mine == theirs, field


def test_claim_appears_and_disappears_with_its_process(lab: Lab) -> None:
    lab.write(h200())
    module = load_module()
    proc = subprocess.Popen(["sleep", "120"])
    try:
        path = module.write_claim(0, 1000, "python3", claims_dir=str(lab.claims), pid=proc.pid)
        assert json.loads(Path(path).read_text())["starttime"]
        assert f"{proc.pid}, python3, 1000" in lab.ok(
            "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")
        assert lab.ok("--query-gpu=memory.used", "--format=csv,noheader,nounits") == "1009\n"
    finally:
        os.kill(proc.pid, 9)
        proc.wait()
    assert lab.ok("--query-gpu=memory.used", "--format=csv,noheader,nounits") == "0\n"
    assert "No running processes found" in lab.ok()
    assert not Path(path).exists()  # the stale file was removed


def test_remove_claim_and_pid_reuse(lab: Lab, sleeper: subprocess.Popen[bytes]) -> None:
    lab.write(h200())
    module = load_module()
    module.write_claim(0, 500, "python3", claims_dir=str(lab.claims), pid=sleeper.pid)
    assert module.remove_claim(sleeper.pid, claims_dir=str(lab.claims)) is True
    assert module.remove_claim(sleeper.pid, claims_dir=str(lab.claims)) is False
    lab.claims.mkdir(exist_ok=True)
    reused = {"pid": sleeper.pid, "gpu_index": 0, "used_mib": 77, "process_name": "old",
              "starttime": "1"}  # a live PID, but not the process that made the claim
    (lab.claims / f"{sleeper.pid}.json").write_text(json.dumps(reused))
    (lab.claims / "junk.json").write_text("{not json")
    assert lab.ok("--query-compute-apps=pid", "--format=csv,noheader") == ""


def test_missing_index_exits_6_like_the_real_tool(lab: Lab) -> None:
    real = fact("cuda-missing-device.txt").splitlines()
    lab.write(h200())
    done = lab.run("-i", "7")
    assert done.stdout == real[-2] + "\n"
    assert f"rc={done.returncode}" == real[-1]
    assert lab.run("--id=0,7").returncode == 6


def test_id_selects_gpus_by_index_uuid_and_bus_id(lab: Lab) -> None:
    lab.write(ct129())
    query = ("--query-gpu=index", "--format=csv,noheader")
    assert lab.ok("-i", "1", *query) == "1\n"
    assert lab.ok("--id=1,0", *query) == "1\n0\n"
    assert lab.ok("-i", "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd", *query) == "0\n"
    assert lab.ok("-i", "00000000:02:00.0", *query) == "1\n"
    na = lab.ok("-i", "0", "--query-gpu=mig.mode.current,fan.speed", "--format=csv,noheader")
    assert na == "[N/A], 30 %\n"
    assert lab.ok("-L") == (
        "GPU 0: NVIDIA RTX A6000 (UUID: GPU-00000000-aaaa-bbbb-cccc-dddddddddddd)\n"
        "GPU 1: NVIDIA RTX A6000 (UUID: GPU-00000001-aaaa-bbbb-cccc-dddddddddddd)\n")
    assert lab.ok("--query-gpu=gpu_name,gpu_uuid,gpu_bus_id,count", "--format=csv").startswith(
        "name, uuid, pci.bus_id, count\nNVIDIA RTX A6000, GPU-0000")


def test_dead_gpu(lab: Lab, sleeper: subprocess.Popen[bytes]) -> None:
    lab.write(ct129())
    load_module().write_claim(1, 4000, "python3", claims_dir=str(lab.claims), pid=sleeper.pid)
    table = lab.ok().splitlines()
    assert all(len(line) == 91 for line in table[1:] if line)
    row = next(i for i, line in enumerate(table) if "00000000:02:00.0" in line)
    assert table[row + 1].count("ERR!") == 5
    assert "       0MiB /  49140MiB" in table[row + 1]
    assert "No running processes found" in lab.ok()  # a dead GPU holds no process
    csv = lab.ok("-i", "1", "--query-gpu=index,memory.used,utilization.gpu,temperature.gpu,"
                 "power.draw", "--format=csv,noheader,nounits")
    assert csv == "1, 0, [Unknown Error], [Unknown Error], [Unknown Error]\n"
    done = lab.run("-r", "-i", "1")
    assert (done.returncode, done.stdout) == (
        3, "The following GPUs could not be reset:\n  GPU 00000000:02:00.0: Not Supported\n")
    assert lab.ok("-r", "-i", "0") == "GPU 00000000:01:00.0 was successfully reset.\n"
    xml = ET.fromstring(lab.ok("-q", "-x", "-i", "1"))
    assert xml.findtext("gpu/utilization/gpu_util") == "Unknown Error"


def test_reset_refused_while_in_use(lab: Lab, sleeper: subprocess.Popen[bytes]) -> None:
    lab.write(ct129())
    load_module().write_claim(0, 100, "python3", claims_dir=str(lab.claims), pid=sleeper.pid)
    done = lab.run("--gpu-reset", "-i", "0")
    assert done.returncode == 255
    assert "GPU 00000000:01:00.0: In use by another client" in done.stdout


def test_xml_follows_the_real_structure(lab: Lab, sleeper: subprocess.Popen[bytes]) -> None:
    real_text = fact("nvidia-smi-q.xml.txt")
    real = ET.fromstring(real_text.split("\n", 2)[2])  # past the declaration and DOCTYPE
    lab.write(h200(uuid=UUID_IDLE))
    idle = lab.ok("-q", "-x")
    assert idle.splitlines()[:2] == real_text.splitlines()[:2]
    ours = ET.fromstring(idle.split("\n", 2)[2])

    def paths(node: ET.Element, prefix: str = "") -> list[str]:
        out = []
        for child in node:
            out += [prefix + child.tag] + paths(child, prefix + child.tag + "/")
        return out

    real_paths = paths(real)
    ours_paths = [p for p in paths(ours) if "process_info" not in p]
    assert set(ours_paths) <= set(real_paths)
    assert ours_paths == [p for p in real_paths if p in set(ours_paths)]  # same order
    for path in ("driver_version", "cuda_version", "attached_gpus", "gpu/product_name",
                 "gpu/uuid", "gpu/pci/pci_bus_id", "gpu/fb_memory_usage/total",
                 "gpu/fb_memory_usage/used", "gpu/fb_memory_usage/free", "gpu/persistence_mode",
                 "gpu/mig_mode/current_mig", "gpu/compute_mode", "gpu/product_architecture"):
        assert ours.findtext(path) == real.findtext(path), path
    assert ours.find("gpu").get("id") == real.find("gpu").get("id")  # type: ignore[union-attr]
    load_module().write_claim(0, 6242, "python3", claims_dir=str(lab.claims), pid=sleeper.pid)
    busy = ET.fromstring(lab.ok("-q", "-x").split("\n", 2)[2])
    info = busy.find("gpu/processes/process_info")
    assert info is not None
    assert [info.findtext(k) for k in ("pid", "process_name", "used_memory")] == [
        str(sleeper.pid), "python3", "6242 MiB"]
    assert busy.findtext("gpu/fb_memory_usage/used") == "6251 MiB"


def test_names_are_cut_like_the_real_table(lab: Lab, sleeper: subprocess.Popen[bytes]) -> None:
    lab.write(h200(name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition"))
    long_name = "/root/venv_sglang/bin/python3 -m sglang.launch_server"
    load_module().write_claim(0, 10, long_name, claims_dir=str(lab.claims), pid=sleeper.pid)
    table = lab.ok()
    assert "|   0  NVIDIA RTX PRO 6000 Blac...    On  |" in table
    assert f"   ...{long_name[-29:]}" in table
    assert all(len(line) == 91 for line in table.splitlines()[1:] if line)


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["--bogus"], 2, "ERROR: Option --bogus is not recognized. "
                         "Please run 'nvidia-smi -h' for help.\n"),
        (["--query-gpu=index,nope", "--format=csv"], 2,
         'Field "nope" is not a valid field to query.\n\n'),
        (["--query-compute-apps=pid,nope", "--format=csv"], 2,
         'Field "nope" is not a valid field to query.\n\n'),
        (["--query-gpu=index"], 2, None),
        (["--query-gpu=index", "--format=csv,fancy"], 2, None),
        (["-i"], 2, None),
    ],
)
def test_bad_arguments(lab: Lab, args: list[str], code: int, text: str | None) -> None:
    done = lab.write(h200()).run(*args)
    assert done.returncode == code
    assert "Traceback" not in done.stdout + done.stderr
    if text is not None:
        assert done.stdout == text
    else:
        assert "nvidia-smi -h" in done.stdout


def test_missing_or_broken_spec(lab: Lab) -> None:
    done = lab.run()
    assert done.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in done.stdout
    lab.spec.write_text('{"gpus": [{"index": 0}]}')
    done = lab.run("-L")
    assert done.returncode == 9
    assert done.stderr.startswith("nvidia-smi stand-in: bad GPU spec")
    assert "Traceback" not in done.stderr
    lab.write({"driver_version": "580.95.05", "cuda_version": "13.0", "gpus": []})
    done = lab.run()
    assert (done.returncode, done.stdout) == (6, "No devices were found\n")


def test_version_and_text_query(lab: Lab) -> None:
    lab.write(h200())
    version = lab.ok("--version")
    assert "DRIVER version      : 580.159.04\n" in version
    assert "CUDA Version        : 13.0\n" in version
    text = lab.ok("-q")
    assert "    Product Name                          : NVIDIA H200\n" in text
    assert "        Free                              : 143156 MiB\n" in text
