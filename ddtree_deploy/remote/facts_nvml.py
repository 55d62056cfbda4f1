"""The NVIDIA driver and GPUs through NVML (libnvidia-ml.so.1, the library nvidia-smi uses).

One process asks NVML directly, with ctypes, where each nvidia-smi call would start a program
that opens the driver again. Fields and error texts are those of the nvidia-smi queries the
probe otherwise runs (facts_sys.nvidia_info), so the facts read the same either way:
  - memory in MiB as nvidia-smi shows it (v2 memory info: "used" leaves out the driver's
    reserve; the v1 call, for older drivers, counts it);
  - a GPU whose temperature, utilization or performance state fails with anything but
    "Not Supported" is dead, with "<nvidia-smi field>: <NVML error text>" per failing cell;
    a GPU NVML has no handle for (lost) is dead with its index and NVML's error.
nvml_info returns None when NVML cannot be loaded or started: the caller then asks nvidia-smi,
whose own message says why. nvml_info_bounded asks NVML in a forked child, as nvidia-smi was a
child: a driver stuck on a failed GPU (or a crash in the library) can then cost the probe its
GPU facts, never the whole probe. Part of the probe bundle: stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import time
from collections.abc import Callable
from typing import Any

NVML_SUCCESS, NVML_NOT_SUPPORTED, NVML_INSUFFICIENT_SIZE = 0, 3, 7
NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory when the driver cannot tell
MIB = 1 << 20


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]  # fmt: skip


class _MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]  # fmt: skip


MEMORY_V2 = ctypes.sizeof(_MemoryV2) | (2 << 24)  # nvml.h NVML_STRUCT_VERSION(Memory, 2)


class _PciInfo(ctypes.Structure):  # nvmlPciInfo_t as of the _v3 call
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint),
                ("bus", ctypes.c_uint), ("device", ctypes.c_uint),
                ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]  # fmt: skip


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _ProcessV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessV3(ctypes.Structure):  # also the _v2 layout
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Nvml:
    """The loaded library and its error texts."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.nvmlErrorString.restype = ctypes.c_char_p

    def error(self, rc: int) -> str:
        try:
            text = self.lib.nvmlErrorString(rc)
        except (AttributeError, ctypes.ArgumentError):
            text = None
        return text.decode("utf-8", "replace") if text else f"NVML error {rc}"

    def fn(self, *names: str) -> Callable[..., int] | None:
        """The first of `names` the library exports (newest first)."""
        for name in names:
            found = getattr(self.lib, name, None)
            if found is not None:
                return found
        return None

    def need(self, *names: str) -> Callable[..., int]:
        """As fn, for a call every NVML has: AttributeError (the part's error) if absent."""
        found = self.fn(*names)
        if found is None:
            raise AttributeError(f"libnvidia-ml has no {names[0]}")
        return found

    def text(self, name: str, handle: Any, size: int = 96) -> str | None:
        buf = ctypes.create_string_buffer(size)
        if getattr(self.lib, name)(handle, buf, size) != NVML_SUCCESS:
            return None
        return buf.value.decode("utf-8", "replace")


def load_nvml(lib: str = "libnvidia-ml.so.1") -> Nvml | None:
    try:
        nvml = Nvml(ctypes.CDLL(lib))
    except (OSError, AttributeError):
        return None
    init = nvml.fn("nvmlInit_v2", "nvmlInit")
    if init is None or init() != NVML_SUCCESS:
        return None
    return nvml


def nvml_info(ports_by_pid: dict[int, list[int]], proc_unit: Callable[[int], str | None],
              lib: str = "libnvidia-ml.so.1") -> dict[str, Any] | None:
    """Driver, CUDA version and GPUs with their processes, like facts_sys.nvidia_info; None
    when NVML is not there or does not start."""
    nvml = load_nvml(lib)
    if nvml is None:
        return None
    try:
        return _read(nvml, ports_by_pid, proc_unit)
    finally:
        shutdown = nvml.fn("nvmlShutdown")
        if shutdown is not None:
            shutdown()


def nvml_info_bounded(ports_by_pid: dict[int, list[int]],
                      proc_unit: Callable[[int], str | None], lib: str = "libnvidia-ml.so.1",
                      timeout: float = 5.0) -> dict[str, Any] | None:
    """nvml_info in a forked child, waited for at most `timeout` s. A child that does not
    answer in time is left behind (one stuck in the kernel cannot be killed) holding none of
    the probe's output; a child that dies without answering counts as no NVML (None)."""
    try:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
    except OSError:
        return nvml_info(ports_by_pid, proc_unit, lib)
    if pid == 0:  # the child: answer on the pipe, never return into the probe
        code = 1
        try:
            os.close(read_fd)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # hold none of the probe's streams, even if stuck
                os.dup2(null, fd)
            data = json.dumps(nvml_info(ports_by_pid, proc_unit, lib)).encode()
            with os.fdopen(write_fd, "wb") as out:
                out.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                _reap_later(pid)
                return {"present": False, "source": "nvml", "driver_version": None,
                        "cuda_version": None, "gpus": [],
                        "error": f"NVML did not answer within {timeout:g}s"}  # fmt: skip
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    _reap_later(pid)
    try:
        found = json.loads(b"".join(chunks) or b"null")
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _reap_later(pid: int) -> None:
    """Collect the child if it has ended; one that has not is left (the probe exits soon)."""
    for _ in range(20):
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.005)


def _read(nvml: Nvml, ports_by_pid: dict[int, list[int]],
          proc_unit: Callable[[int], str | None]) -> dict[str, Any]:
    info: dict[str, Any] = {"present": True, "source": "nvml", "driver_version": None,
                            "cuda_version": None, "gpus": [], "error": None}  # fmt: skip
    buf = ctypes.create_string_buffer(96)
    if nvml.lib.nvmlSystemGetDriverVersion(buf, 96) == NVML_SUCCESS:
        info["driver_version"] = buf.value.decode("ascii", "replace") or None
    version = ctypes.c_int(0)
    get_cuda = nvml.fn("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion")
    if get_cuda is not None and get_cuda(ctypes.byref(version)) == NVML_SUCCESS \
            and version.value > 0:
        info["cuda_version"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
    count = ctypes.c_uint(0)
    rc = nvml.need("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount")(ctypes.byref(count))
    if rc != NVML_SUCCESS:
        info["error"] = f"NVML device count: {nvml.error(rc)}"
        return info
    get_handle = nvml.need("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex")
    errors: list[str] = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        rc = get_handle(index, ctypes.byref(handle))
        if rc != NVML_SUCCESS:
            info["gpus"].append({"index": index, "dead": True, "error": nvml.error(rc),
                                 "processes": []})  # fmt: skip
            continue
        gpu = _gpu(nvml, index, handle)
        if not gpu["dead"]:
            gpu["processes"], why = _processes(nvml, handle, ports_by_pid, proc_unit)
            if why:  # as the nvidia-smi path reports a failed --query-compute-apps
                errors.append(f"NVML processes of GPU {index}: {why}")
        info["gpus"].append(gpu)
    info["error"] = "; ".join(errors) or None
    return info


def _gpu(nvml: Nvml, index: int, handle: Any) -> dict[str, Any]:
    gpu: dict[str, Any] = {"index": index, "uuid": nvml.text("nvmlDeviceGetUUID", handle),
                           "name": nvml.text("nvmlDeviceGetName", handle),
                           "pci_bus_id": None, "memory_total_mib": None,
                           "memory_used_mib": None, "compute_cap": None, "dead": False,
                           "error": None, "processes": []}  # fmt: skip
    pci = _PciInfo()
    get_pci = nvml.fn("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2")
    if get_pci is not None and get_pci(handle, ctypes.byref(pci)) == NVML_SUCCESS:
        gpu["pci_bus_id"] = pci.busId.decode("ascii", "replace") or None
    mem2 = _MemoryV2(version=MEMORY_V2)
    get_mem2 = nvml.fn("nvmlDeviceGetMemoryInfo_v2")
    if get_mem2 is not None and get_mem2(handle, ctypes.byref(mem2)) == NVML_SUCCESS:
        gpu["memory_total_mib"], gpu["memory_used_mib"] = mem2.total // MIB, mem2.used // MIB
    else:
        mem = _Memory()
        if nvml.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == NVML_SUCCESS:
            gpu["memory_total_mib"], gpu["memory_used_mib"] = mem.total // MIB, mem.used // MIB
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    if nvml.lib.nvmlDeviceGetCudaComputeCapability(
            handle, ctypes.byref(major), ctypes.byref(minor)) == NVML_SUCCESS:
        gpu["compute_cap"] = f"{major.value}.{minor.value}"
    # The cells nvidia-smi shows as "[Unknown Error]" / "ERR!" on a GPU that has failed.
    temp, util, pstate = ctypes.c_uint(0), _Utilization(), ctypes.c_int(0)
    errors = []
    for field, rc in (
        ("temperature.gpu", nvml.lib.nvmlDeviceGetTemperature(handle, 0, ctypes.byref(temp))),
        ("utilization.gpu", nvml.lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util))),
        ("pstate", nvml.lib.nvmlDeviceGetPerformanceState(handle, ctypes.byref(pstate))),
    ):
        if rc not in (NVML_SUCCESS, NVML_NOT_SUPPORTED):
            errors.append(f"{field}: {nvml.error(rc)}")
    if errors:
        gpu["dead"], gpu["error"] = True, "; ".join(errors)
    return gpu


def _processes(nvml: Nvml, handle: Any, ports_by_pid: dict[int, list[int]],
               proc_unit: Callable[[int], str | None],
               ) -> tuple[list[dict[str, Any]], str | None]:
    found = nvml.fn("nvmlDeviceGetComputeRunningProcesses_v3",
                    "nvmlDeviceGetComputeRunningProcesses_v2")
    layout: Any = _ProcessV3
    if found is None:
        found, layout = nvml.need("nvmlDeviceGetComputeRunningProcesses"), _ProcessV1
    get = found
    size = 32
    while True:
        count = ctypes.c_uint(size)
        infos = (layout * size)()
        rc = get(handle, ctypes.byref(count), infos)
        if rc == NVML_INSUFFICIENT_SIZE and size < 4096:
            size = max(count.value + 8, size * 2)  # more started since: ask again
            continue
        break
    if rc != NVML_SUCCESS:
        return [], nvml.error(rc)
    out = []
    for info in infos[: count.value]:
        pid = int(info.pid)
        used = None if info.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE \
            else int(info.usedGpuMemory // MIB)
        out.append({"pid": pid, "name": _process_name(nvml, pid), "used_mib": used,
                    "ports": sorted(ports_by_pid.get(pid, [])), "unit": proc_unit(pid)})
    return out, None


def _process_name(nvml: Nvml, pid: int) -> str | None:
    """As nvidia-smi's process_name: NVML's name for the PID, else the PID's comm."""
    buf = ctypes.create_string_buffer(256)
    get = nvml.fn("nvmlSystemGetProcessName")
    if get is not None and get(ctypes.c_uint(pid), buf, 256) == NVML_SUCCESS and buf.value:
        return buf.value.decode("utf-8", "replace")
    try:
        with open(os.path.join("/proc", str(pid), "comm"), encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None
