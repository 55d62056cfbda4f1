"""The probe's host-wide parts: host info, NVIDIA driver and GPUs, units and TCP listeners.

Every sub-command is bounded by a timeout; GPUs come from NVML, else from nvidia-smi calls
run in parallel.
Part of the probe bundle (remote/bundle.py): stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any

from ddtree_deploy.remote.facts_netlink import tcp_listeners_netlink
from ddtree_deploy.remote.facts_nvml import nvml_info_bounded
from ddtree_deploy.remote.facts_parse import (
    APPS_QUERY,
    GPU_QUERY,
    UNIT_PROPS,
    parse_cgroup_unit,
    parse_driver_versions,
    parse_glibc,
    parse_meminfo,
    parse_nvcc_version,
    parse_os_release,
    parse_proc_driver_version,
    parse_proc_net_tcp,
    parse_show_units,
    parse_smi_apps,
    parse_smi_gpus,
    smi_driver_version,
    socket_inode,
)

CMD_TIMEOUT_S = 5.0
PROC = "/proc"  # tests point these at fixtures
UNIT_RE = re.compile(r"sglang|ddtree", re.I)
UNIT_GLOBS = ("*[sS][gG][lL][aA][nN][gG]*", "*[dD][dD][tT][rR][eE][eE]*")  # UNIT_RE as globs
UV_PLACES = ("/root/.local/bin/uv", "/root/.cargo/bin/uv", "/usr/local/bin/uv", "/usr/bin/uv")


class CmdResult:
    """What one bounded sub-command did: rc None = it could not run (error says why)."""

    def __init__(self, rc: int | None, out: str, err: str, error: str | None) -> None:
        self.rc, self.out, self.err, self.error = rc, out, err, error

    def why(self) -> str:
        """A one-line reason for a failure."""
        if self.error:
            return self.error
        text = (self.err.strip() or self.out.strip()).splitlines()
        return f"exit {self.rc}" + (f": {text[-1].strip()}" if text else "")


def start_cmd(argv: list[str]) -> subprocess.Popen[bytes] | CmdResult:
    try:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as exc:
        reason = "not found" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
        return CmdResult(None, "", "", f"{argv[0]}: {reason}")


def finish_cmd(
    proc: subprocess.Popen[bytes] | CmdResult, timeout: float = CMD_TIMEOUT_S
) -> CmdResult:
    """Wait for a started command at most `timeout` s; kill it after that. A process stuck in
    the kernel (nvidia-smi on a dead GPU can be) is abandoned rather than waited for."""
    if isinstance(proc, CmdResult):
        return proc
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.05))
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        args = proc.args
        name = str(args[0]) if isinstance(args, (list, tuple)) and args else str(args)
        return CmdResult(None, "", "", f"{name} did not finish within {CMD_TIMEOUT_S:.0f}s")
    return CmdResult(
        proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), None
    )


def finish_all(
    procs: list[subprocess.Popen[bytes] | CmdResult], timeout: float = CMD_TIMEOUT_S
) -> list[CmdResult]:
    """finish_cmd for commands started together, sharing one deadline."""
    deadline = time.monotonic() + timeout
    return [finish_cmd(p, deadline - time.monotonic()) for p in procs]


def run_cmd(argv: list[str], timeout: float = CMD_TIMEOUT_S) -> CmdResult:
    return finish_cmd(start_cmd(argv), timeout)


def read_small(path: str, limit: int = 1 << 20) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read(limit)


# ---- host ------------------------------------------------------------------------------------


def existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def host_info(venv_paths: list[str]) -> dict[str, Any]:
    uname = os.uname()
    info: dict[str, Any] = {"disks": [], "python": sys.version.split()[0]}
    errors: list[str] = []
    info["hostname"] = uname.nodename
    info["kernel"] = uname.release
    info["cpu_count"] = os.cpu_count()
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        if os.path.isfile(path):
            info["os"] = parse_os_release(read_small(path)).get("PRETTY_NAME")
            break
    try:
        confstr = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        confstr = ""
    info["glibc"] = parse_glibc(confstr)
    if info["glibc"] is None:
        ldd = run_cmd(["ldd", "--version"])
        info["glibc"] = parse_glibc(ldd.out) if ldd.rc == 0 else None
    try:
        mem = parse_meminfo(read_small(os.path.join(PROC, "meminfo")))
        info["mem_total_mib"] = mem["MemTotal"] // 1024 if "MemTotal" in mem else None
        info["mem_available_mib"] = mem["MemAvailable"] // 1024 if "MemAvailable" in mem else None
    except OSError as exc:
        errors.append(f"meminfo: {exc.strerror or exc}")
    seen: set[int] = set()
    for path in ["/", *venv_paths]:
        where = existing_ancestor(path)
        try:
            st = os.statvfs(where)
            dev = os.stat(where).st_dev
        except OSError as exc:
            errors.append(f"disk {where}: {exc.strerror or exc}")
            continue
        if dev in seen:
            continue
        seen.add(dev)
        info["disks"].append(
            {"path": where, "free_mib": st.f_bavail * st.f_frsize // (1 << 20),
             "total_mib": st.f_blocks * st.f_frsize // (1 << 20)}
        )  # fmt: skip
    info["error"] = "; ".join(errors) or None
    return info


# ---- processes and sockets -------------------------------------------------------------------


def proc_comm(pid: int) -> str | None:
    try:
        return read_small(os.path.join(PROC, str(pid), "comm")).strip() or None
    except OSError:
        return None


def proc_unit(pid: int) -> str | None:
    try:
        return parse_cgroup_unit(read_small(os.path.join(PROC, str(pid), "cgroup")))
    except OSError:
        return None


def socket_owners(inodes: set[int]) -> dict[int, int]:
    """{socket inode: pid} for the given inodes, from the links in /proc/PID/fd."""
    owners: dict[int, int] = {}
    if not inodes:
        return owners
    try:
        pids = [int(p) for p in os.listdir(PROC) if p.isdecimal()]
    except OSError:
        return owners
    for pid in sorted(pids):
        fd_dir = os.path.join(PROC, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                inode = socket_inode(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue
            if inode in inodes and inode not in owners:
                owners[inode] = pid
        if len(owners) == len(inodes):
            break
    return owners


def listeners() -> tuple[list[dict[str, Any]], str | None]:
    """TCP listening sockets (from sock_diag netlink, else /proc/net/tcp*) with their owning
    PID, process name and unit (from /proc)."""
    errors: list[str] = []
    netlink = tcp_listeners_netlink() if PROC == "/proc" else None
    found: list[dict[str, Any]] = netlink or []
    for name in ("tcp", "tcp6") if netlink is None else ():
        try:
            found += parse_proc_net_tcp(read_small(os.path.join(PROC, "net", name), 16 << 20))
        except OSError as exc:
            if name == "tcp":
                errors.append(f"/proc/net/tcp: {exc.strerror or exc}")
    owners = socket_owners({s["inode"] for s in found})
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for sock in sorted(found, key=lambda s: (s["port"], s["address"])):
        key = (sock["address"], sock["port"])
        if key in seen:
            continue
        seen.add(key)
        pid = owners.get(sock["inode"])
        out.append(
            {"port": sock["port"], "address": sock["address"], "pid": pid,
             "process": proc_comm(pid) if pid else None, "unit": proc_unit(pid) if pid else None}
        )  # fmt: skip
    return out, "; ".join(errors) or None


# ---- NVIDIA ----------------------------------------------------------------------------------


def cuda_driver_version(lib: str = "libcuda.so.1") -> str | None:
    """The CUDA version the driver speaks ("13.0"), from libcuda's cuDriverGetVersion, which
    needs no cuInit and touches no GPU; None when libcuda cannot be loaded or says nothing."""
    import ctypes

    try:
        cuda = ctypes.CDLL(lib)
        version = ctypes.c_int(0)
        if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def nvidia_info(ports_by_pid: dict[int, list[int]], smi: str = "nvidia-smi",
                libcuda: str = "libcuda.so.1", nvml: str = "libnvidia-ml.so.1") -> dict[str, Any]:
    """Driver, CUDA version and GPUs (dead ones with the error) from NVML (facts_nvml.py);
    where NVML does not start, from two parallel nvidia-smi queries and libcuda, and the
    summary table (the slowest call) only for the CUDA version where
    libcuda cannot tell it."""
    found = nvml_info_bounded(ports_by_pid, proc_unit, nvml, CMD_TIMEOUT_S)
    if found is not None:
        if found["present"] and not found.get("cuda_version"):
            found["cuda_version"] = cuda_driver_version(libcuda)
        return found
    info: dict[str, Any] = {"present": False, "source": "nvidia-smi", "driver_version": None,
                            "cuda_version": None, "gpus": [], "error": None}  # fmt: skip
    fmt = "--format=csv,noheader,nounits"
    procs = [
        start_cmd([smi, "--query-gpu=" + GPU_QUERY, fmt]),
        start_cmd([smi, "--query-compute-apps=" + APPS_QUERY, fmt]),
    ]
    cuda = cuda_driver_version(libcuda)  # loads libcuda (slow) while those run
    if cuda is None:
        procs.append(start_cmd([smi]))
    gpus_r, apps_r, *table = finish_all(procs)
    errors: list[str] = []
    if table:
        info.update(parse_driver_versions(table[0].out))
    else:
        info["cuda_version"] = cuda
        info["driver_version"] = smi_driver_version(gpus_r.out)
    if info["driver_version"] is None:
        try:
            text = read_small(os.path.join(PROC, "driver", "nvidia", "version"))
            info["driver_version"] = parse_proc_driver_version(text)
        except OSError:
            pass
    gpus = parse_smi_gpus(gpus_r.out) if gpus_r.rc is not None else []
    if gpus_r.rc is None or (gpus_r.rc != 0 and not gpus):
        errors.append(f"nvidia-smi --query-gpu: {gpus_r.why()}")
    info["present"] = gpus_r.rc is not None and bool(gpus or gpus_r.rc == 0)
    by_uuid = {g["uuid"]: g for g in gpus if g.get("uuid")}
    if apps_r.rc == 0:
        for app in parse_smi_apps(apps_r.out):
            gpu = by_uuid.get(app.pop("gpu_uuid"))
            if gpu is None:
                continue
            app["ports"] = sorted(ports_by_pid.get(app["pid"], []))
            app["unit"] = proc_unit(app["pid"])
            gpu["processes"].append(app)
    elif gpus:
        errors.append(f"nvidia-smi --query-compute-apps: {apps_r.why()}")
    info["gpus"] = gpus
    info["error"] = "; ".join(errors) or None
    return info


# ---- services --------------------------------------------------------------------------------


def which(name: str) -> str | None:
    """shutil.which for a plain name, without loading shutil (and its compression modules)."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", name)
        if os.access(path, os.X_OK) and os.path.isfile(path):
            return path
    return None


def find_uv() -> str | None:
    found = which("uv")
    if found:
        return found
    home = os.path.expanduser("~")
    for path in (os.path.join(home, ".local/bin/uv"), os.path.join(home, ".cargo/bin/uv"),
                 *UV_PLACES):  # fmt: skip
        if os.access(path, os.X_OK):
            return path
    return None


def find_nvcc() -> str | None:
    """nvcc as flashinfer finds it: $CUDA_HOME/bin/nvcc, PATH, /usr/local/cuda/bin/nvcc."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and os.access(os.path.join(cuda_home, "bin", "nvcc"), os.X_OK):
        return os.path.join(cuda_home, "bin", "nvcc")
    found = which("nvcc")
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.access(default, os.X_OK) else None


def services(gpu_pids: list[int], listening: list[dict[str, Any]]) -> dict[str, Any]:
    """uv, nvcc, systemd units (sglang|ddtree names, GPU holders, listeners) and listeners."""
    info: dict[str, Any] = {"uv": find_uv(), "nvcc": find_nvcc(), "nvcc_version": None,
                            "units": [], "listeners": listening, "error": None}  # fmt: skip
    errors: list[str] = []
    if info["nvcc"]:
        nvcc = run_cmd([info["nvcc"], "--version"])
        info["nvcc_version"] = parse_nvcc_version(nvcc.out)
    found = [proc_unit(pid) for pid in gpu_pids] + [s["unit"] for s in listening]
    wanted = {str(unit) for unit in found if unit}
    # One call: the units matching the names (globs over the units systemd has loaded, as
    # `list-units --all` lists them) and the GPU holders' and listeners' own units.
    shown = run_cmd(["systemctl", "show", "--no-pager", "-p", UNIT_PROPS, "--", *UNIT_GLOBS,
                     *sorted(wanted)])  # fmt: skip
    if shown.rc is None or (shown.rc != 0 and not shown.out.strip()):
        errors.append(f"systemctl show: {shown.why()}")
    else:
        info["units"] = [u for u in parse_show_units(shown.out)
                         if UNIT_RE.search(u["name"]) or u["name"] in wanted]  # fmt: skip
    info["error"] = "; ".join(errors) or None
    return info


def elapsed(start: float) -> float:
    return round(time.monotonic() - start, 3)
