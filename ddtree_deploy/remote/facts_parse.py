"""Pure parsers of the host probe: text in, plain dicts/lists out (no I/O, stdlib only).

Part of the probe bundle (see remote/bundle.py): Python >= 3.8 syntax, no third-party imports,
no work at import. Every name defined here is unique across the probe_* parts.
"""

from __future__ import annotations

import re
from typing import Any

# ---- nvidia-smi ------------------------------------------------------------------------------

GPU_QUERY = (
    "index,uuid,name,memory.total,memory.used,compute_cap,pci.bus_id,"
    "temperature.gpu,utilization.gpu,pstate,"  # these read "[Unknown Error]" on a dead GPU
    "driver_version"
)
APPS_QUERY = "pid,process_name,used_memory,gpu_uuid"
# Values that mean "not available" rather than "broken".
_SMI_NA = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")
_LOST_RE = re.compile(
    r"Unable to determine the device handle for (?:GPU\s*)?([0-9A-Fa-f:.]+)\s*:\s*(.+)"
)


def smi_cell_error(value: str) -> str | None:
    """The error a CSV cell carries ("[Unknown Error]", "ERR!", "[GPU is lost]"), else None."""
    value = value.strip()
    if value in _SMI_NA:
        return None
    if value == "ERR!" or (value.startswith("[") and value.endswith("]")):
        return value.strip("[]")
    return None


def _smi_int(value: str) -> int | None:
    value = value.strip()
    if value.endswith("MiB"):
        value = value[:-3].strip()
    try:
        return int(float(value))
    except ValueError:
        return None


def _smi_text(value: str) -> str | None:
    value = value.strip()
    if value in _SMI_NA or smi_cell_error(value):
        return None
    return value


def _csv_rows(text: str, fields: list[str], merge: str | None) -> list[dict[str, str]]:
    """Rows of nvidia-smi CSV (", " separated) whose first cell is a number (headers and
    warnings skipped); extra cells are joined back into the `merge` column (a name with ", ")."""
    rows: list[dict[str, str]] = []
    for raw in text.splitlines():
        cells = [c.strip() for c in raw.strip().split(", ")]
        if not cells[0].isdecimal() or len(cells) < len(fields):
            continue
        extra = len(cells) - len(fields)
        if extra and merge in fields:
            at = fields.index(merge)
            cells[at : at + extra + 1] = [", ".join(cells[at : at + extra + 1])]
        elif extra:
            continue
        rows.append({fields[i]: cells[i] for i in range(len(fields))})
    return rows


def parse_smi_gpus(text: str, query: str = GPU_QUERY) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=QUERY --format=csv[,noheader][,nounits]` -> one dict per GPU.

    A row with error cells ("[Unknown Error]", "ERR!") gives a dead GPU with the error text;
    an "Unable to determine the device handle" line (a GPU the driver lost) gives a dead GPU
    with index -1 and its PCI bus id.
    """
    gpus: list[dict[str, Any]] = []
    for raw in text.splitlines():
        lost = _LOST_RE.search(raw)
        if lost:
            gpus.append(
                {"index": -1, "pci_bus_id": lost.group(1), "dead": True,
                 "error": lost.group(2).strip(), "processes": []}
            )  # fmt: skip
    for row in _csv_rows(text, query.split(","), "name"):
        errors = [f"{k}: {e}" for k, e in ((k, smi_cell_error(v)) for k, v in row.items()) if e]
        gpus.append(
            {
                "index": int(row["index"]),
                "uuid": _smi_text(row.get("uuid", "")),
                "name": _smi_text(row.get("name", "")),
                "pci_bus_id": _smi_text(row.get("pci.bus_id", "")),
                "memory_total_mib": _smi_int(row.get("memory.total", "")),
                "memory_used_mib": _smi_int(row.get("memory.used", "")),
                "compute_cap": _smi_text(row.get("compute_cap", "")),
                "dead": bool(errors),
                "error": "; ".join(errors) or None,
                "processes": [],
            }
        )
    return sorted(gpus, key=lambda g: g["index"])


def smi_driver_version(text: str, query: str = GPU_QUERY) -> str | None:
    """The driver version from a `--query-gpu` answer that asked for driver_version (the
    first GPU that states one)."""
    if "driver_version" not in query.split(","):
        return None
    for row in _csv_rows(text, query.split(","), "name"):
        value = _smi_text(row.get("driver_version", ""))
        if value and re.fullmatch(r"[0-9][0-9.]*", value):
            return value
    return None


def parse_smi_apps(text: str, query: str = APPS_QUERY) -> list[dict[str, Any]]:
    """`--query-compute-apps=QUERY --format=csv[,noheader][,nounits]` -> [{pid, name, ...}]."""
    return [
        {
            "pid": int(row["pid"]),
            "name": _smi_text(row.get("process_name", "")),
            "used_mib": _smi_int(row.get("used_memory", "")),
            "gpu_uuid": _smi_text(row.get("gpu_uuid", "")),
        }
        for row in _csv_rows(text, query.split(","), "process_name")
    ]


_HEADER_DRIVER = re.compile(r"Driver Version\s*:\s*([0-9][0-9.]*)")
_HEADER_CUDA = re.compile(r"CUDA Version\s*:\s*([0-9][0-9.]*)")
_XML_DRIVER = re.compile(r"<driver_version>\s*([0-9][0-9.]*)\s*</driver_version>")
_XML_CUDA = re.compile(r"<cuda_version>\s*([0-9][0-9.]*)\s*</cuda_version>")
_PROC_DRIVER = re.compile(r"NVRM version:.*?\s([0-9]{3,}\.[0-9]+(?:\.[0-9]+)?)\s")


def parse_driver_versions(text: str) -> dict[str, str | None]:
    """Driver and CUDA version from `nvidia-smi` (table), `--version`, `-q` or `-q -x` text."""
    driver = _HEADER_DRIVER.search(text) or _XML_DRIVER.search(text)
    cuda = _HEADER_CUDA.search(text) or _XML_CUDA.search(text)
    if driver is None:  # `nvidia-smi --version` says "DRIVER version      : 580.159.04"
        driver = re.search(r"DRIVER version\s*:\s*([0-9][0-9.]*)", text)
    return {
        "driver_version": driver.group(1) if driver else None,
        "cuda_version": cuda.group(1) if cuda else None,
    }


def parse_proc_driver_version(text: str) -> str | None:
    """The driver version from /proc/driver/nvidia/version."""
    found = _PROC_DRIVER.search(text + " ")
    return found.group(1) if found else None


# ---- /proc ------------------------------------------------------------------------------------


def _ipv4(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)[::-1]  # one 32-bit word in host (little-endian) order
    return ".".join(str(b) for b in raw)


def _ipv6(hexaddr: str) -> str:
    raw = b"".join(bytes.fromhex(hexaddr[i : i + 8])[::-1] for i in range(0, 32, 8))
    groups = [format(int.from_bytes(raw[i : i + 2], "big"), "x") for i in range(0, 16, 2)]
    text = ":".join(groups)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(str(b) for b in raw[12:])
    # Compress the longest run of zero groups (RFC 5952 style).
    best, best_len, i = -1, 0, 0
    while i < 8:
        if groups[i] == "0":
            j = i
            while j < 8 and groups[j] == "0":
                j += 1
            if j - i > best_len:
                best, best_len = i, j - i
            i = j
        else:
            i += 1
    if best_len >= 2:
        text = ":".join(groups[:best]) + "::" + ":".join(groups[best + best_len :])
    return text


def parse_proc_net_tcp(text: str) -> list[dict[str, Any]]:
    """LISTEN sockets (state 0A) of /proc/net/tcp or tcp6 -> [{address, port, inode}]."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or parts[3] != "0A" or ":" not in parts[1]:
            continue
        addr, _, port = parts[1].rpartition(":")
        try:
            address = _ipv4(addr) if len(addr) == 8 else _ipv6(addr) if len(addr) == 32 else None
            if address is None:
                continue
            out.append({"address": address, "port": int(port, 16), "inode": int(parts[9])})
        except ValueError:
            continue
    return out


def socket_inode(link: str) -> int | None:
    """`socket:[15413]` (a readlink of /proc/PID/fd/N) -> 15413."""
    found = re.match(r"socket:\[(\d+)\]$", link)
    return int(found.group(1)) if found else None


def parse_cgroup_unit(text: str) -> str | None:
    """The systemd unit owning a process, from /proc/PID/cgroup (v2 or v1 name=systemd)."""
    path = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[0] == "0" and parts[1] == "" or parts[1] == "name=systemd"):
            path = parts[2]
            if parts[0] == "0":
                break
    if not path:
        return None
    segments = [s for s in path.split("/") if s]
    for suffix in (".service", ".scope"):
        hits = [s for s in segments if s.endswith(suffix)]
        if hits:
            return hits[-1]
    return None


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {"MemTotal": kB, ...}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdecimal():
            out[key.strip()] = int(fields[0])
    return out


def parse_os_release(text: str) -> dict[str, str]:
    """/etc/os-release -> {"PRETTY_NAME": ..., ...} (quotes removed)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.strip().partition("=")
        if not eq or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key] = value
    return out


def parse_glibc(text: str) -> str | None:
    """`ldd --version` first line or os.confstr('CS_GNU_LIBC_VERSION') ("glibc 2.36") -> "2.36"."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    found = re.search(r"(\d+\.\d+(?:\.\d+)?)\s*$", first)
    return found.group(1) if found else None


# ---- systemd ----------------------------------------------------------------------------------


UNIT_PROPS = "Id,LoadState,ActiveState,SubState,Description,MainPID"


def parse_show_units(text: str) -> list[dict[str, Any]]:
    """`systemctl show -p UNIT_PROPS PATTERN...` -> [{name, load, active, sub, description,
    main_pid}] sorted by name; units systemd does not know (not-found) are left out."""
    units = []
    for name, props in parse_systemctl_show(text).items():
        if props.get("LoadState") == "not-found":
            continue
        pid = props.get("MainPID", "")
        units.append(
            {"name": name, "load": props.get("LoadState") or None,
             "active": props.get("ActiveState") or None, "sub": props.get("SubState") or None,
             "description": props.get("Description") or None,
             "main_pid": int(pid) if pid.isdecimal() and pid != "0" else None}
        )  # fmt: skip
    return sorted(units, key=lambda u: u["name"])


def parse_systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """`systemctl show -p Id,... U1 U2` (blocks split by blank lines) -> {Id: {key: value}}."""
    out: dict[str, dict[str, str]] = {}
    for block in re.split(r"\n\s*\n", text):
        props = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            out[props["Id"]] = props
    return out


# ---- Python packaging -------------------------------------------------------------------------


def canonical_name(name: str) -> str:
    """PEP 503: runs of -, _ and . become one -, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_metadata(text: str) -> dict[str, str | None]:
    """The Name and Version headers of a dist-info METADATA (or egg-info PKG-INFO)."""
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break  # the body starts
        key, _, value = line.partition(":")
        if key == "Name" and name is None:
            name = value.strip()
        elif key == "Version" and version is None:
            version = value.strip()
    return {"name": name, "version": version}


def parse_record_paths(text: str) -> list[str]:
    """File paths of a dist-info RECORD (first CSV column; quoted paths handled)."""
    paths: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith('"'):
            end = line.find('",', 1)
            path = line[1:end] if end > 0 else line.strip('"')
            paths.append(path.replace('""', '"'))
        else:
            paths.append(line.split(",", 1)[0])
    return paths


def parse_torch_version_py(text: str) -> dict[str, str | None]:
    """torch/version.py -> {"version": "2.9.1+cu128", "cuda": "12.8"}, read with ast, never run."""
    import ast  # loaded only when a file is parsed (often the memo knows)

    tree = ast.parse(text)
    found: dict[str, str | None] = {"version": None, "cuda": None}
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for target in targets:
            if isinstance(target, ast.Name) and target.id in ("__version__", "cuda"):
                key = "version" if target.id == "__version__" else "cuda"
                literal = value.value if isinstance(value, ast.Constant) else None
                found[key] = literal if isinstance(literal, str) else None
    return found


def parse_nvcc_version(text: str) -> str | None:
    """`nvcc --version` ("Cuda compilation tools, release 12.8, V12.8.93") -> "12.8"."""
    found = re.search(r"release (\d+\.\d+)", text)
    return found.group(1) if found else None


# ---- CUDA sonames -----------------------------------------------------------------------------

# Libraries of the CUDA family (DT_NEEDED entries worth reporting), by soname stem.
CUDA_LIB_STEMS = (
    "libcuda", "libcudart", "libnvrtc", "libnvrtc-builtins", "libcublas", "libcublasLt",
    "libcufft", "libcufftw", "libcurand", "libcusolver", "libcusolverMg", "libcusparse",
    "libcusparseLt", "libnvJitLink", "libcupti", "libnvToolsExt", "libnvtx3interop", "libcufile",
    "libnvblas", "libcudnn", "libnccl", "libnvshmem_host", "libnvperf_host",
)  # fmt: skip
# soname major == CUDA major for these ...
_SAME_MAJOR = ("libcudart", "libnvrtc", "libnvrtc-builtins", "libcublas", "libcublasLt",
               "libnvJitLink", "libcupti", "libnvblas")  # fmt: skip
# ... and a table for those whose soname major lags (real: torch 2.11.0+cu130 needs
# libcufft.so.12 and libcusparse.so.12; torch 2.9.1+cu128 needs libcufft.so.11).
# Majors shared by two CUDA releases (libcusparse.so.12, libcurand.so.10) tell nothing.
_LAGGING = {
    "libcufft": {10: 11, 11: 12, 12: 13},
    "libcufftw": {10: 11, 11: 12, 12: 13},
    "libcusolver": {12: 13},
    "libcusolverMg": {12: 13},
    "libcusparse": {11: 11},
}
_SONAME_RE = re.compile(r"^(lib[A-Za-z0-9_+-]+?)(?:\.alt)?\.so(?:\.(\d+))?(?:\.[0-9.]*)?$")


def soname_stem(soname: str) -> tuple[str, int | None]:
    """Stem and major: "libcudart.so.13" -> ("libcudart", 13), "libc10.so" -> ("libc10", None)."""
    found = _SONAME_RE.match(soname)
    if not found:
        return soname, None
    return found.group(1), int(found.group(2)) if found.group(2) else None


def is_cuda_lib(soname: str) -> bool:
    stem, _ = soname_stem(soname)
    return stem in CUDA_LIB_STEMS or stem.startswith("libcudnn")


def cuda_major_of(soname: str) -> int | None:
    """The CUDA major a soname pins: libcudart.so.12 -> 12, libnvrtc.so.13 -> 13,
    libcufft.so.11 -> 12; None for libcuda.so.1 (driver), libcudnn (own versioning), etc."""
    stem, major = soname_stem(soname)
    if major is None:
        return None
    if stem in _SAME_MAJOR:
        return major
    return _LAGGING.get(stem, {}).get(major)
