"""The nvidia-smi stand-in's GPU claims: which live process holds how much memory on which GPU.

Claims: $DDTREE_LAB_GPU_CLAIMS, default /run/ddtree-lab/gpu-claims, one `<pid>.json` file each
{"pid", "gpu_index", "used_mib", "process_name", "starttime"}. A claim counts while /proc/<pid>
exists and, if starttime is given, field 22 of /proc/<pid>/stat still equals it (this catches PID
reuse). Stale claim files are deleted when they are read. write_claim() and remove_claim() manage
these files for other stand-ins. Stdlib only, imports nothing of the stand-in (a leaf), and
importing it does nothing.
"""

import contextlib
import json
import os
from typing import Any

CLAIMS_ENV, DEFAULT_CLAIMS = "DDTREE_LAB_GPU_CLAIMS", "/run/ddtree-lab/gpu-claims"


def _claims_dir(claims_dir: str | None = None) -> str:
    return claims_dir or os.environ.get(CLAIMS_ENV) or DEFAULT_CLAIMS


def proc_starttime(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None if the PID is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2 :].split()  # fields 3.. follow the parenthesised comm
    return rest[19] if len(rest) > 19 else None


def write_claim(
    gpu_index: int,
    used_mib: int,
    process_name: str,
    claims_dir: str | None = None,
    pid: int | None = None,
) -> str:
    """Record that `pid` (default: this process) holds `used_mib` MiB on GPU `gpu_index`."""
    pid = os.getpid() if pid is None else pid
    folder = _claims_dir(claims_dir)
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        with contextlib.suppress(OSError):  # any lab user's server may claim, like /tmp
            os.chmod(folder, 0o1777)
    claim = {
        "pid": pid,
        "gpu_index": int(gpu_index),
        "used_mib": int(used_mib),
        "process_name": process_name,
        "starttime": proc_starttime(pid),
    }
    path = os.path.join(folder, f"{pid}.json")
    tmp = os.path.join(folder, f".{pid}.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(claim, fh)
    os.replace(tmp, path)
    return path


def remove_claim(pid: int, claims_dir: str | None = None) -> bool:
    """Delete the claim of `pid`; True if there was one."""
    try:
        os.unlink(os.path.join(_claims_dir(claims_dir), f"{int(pid)}.json"))
    except FileNotFoundError:
        return False
    return True


def live_claims(claims_dir: str | None = None) -> list[dict[str, Any]]:
    """The claims whose process still runs, sorted by (gpu_index, pid). Stale files are deleted."""
    folder, live = _claims_dir(claims_dir), []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as fh:
                claim = json.load(fh)
            pid, gpu, used = int(claim["pid"]), int(claim["gpu_index"]), int(claim["used_mib"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable or half-written: not a claim
        now = proc_starttime(pid)
        want = claim.get("starttime")
        if now is None or (want is not None and str(want) != now):
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        live.append(
            {
                "pid": pid,
                "gpu_index": gpu,
                "used_mib": used,
                "process_name": str(claim.get("process_name") or "python3"),
            }
        )
    return sorted(live, key=lambda c: (c["gpu_index"], c["pid"]))
