"""The host probe's entry point: gather every part, print ONE JSON object (facts.model.Facts).

Runs on the host as one stdlib-only script (remote/bundle.py joins the facts_* parts and this
file) fed on stdin: `python3 - --venv /root/venv --discover --host-name ct200`. Importing it
does nothing; main(argv) does the work. Each part is wrapped: an exception in one part becomes
that part's "error" and the rest still report. Python >= 3.8 syntax.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ddtree_deploy.remote.facts_elf import open_regular
from ddtree_deploy.remote.facts_memo import MEMO_PATH, Memo
from ddtree_deploy.remote.facts_sglang import (
    WANTED_NAMES,
    exported_names,
    payload_state,
    sglang_info,
)
from ddtree_deploy.remote.facts_sys import (
    elapsed,
    host_info,
    listeners,
    nvidia_info,
    services,
)
from ddtree_deploy.remote.facts_venv import (
    find_package_dir,
    find_site_packages,
    nvidia_layout,
    scan_distributions,
    scan_extensions,
    torch_info,
    venv_python_version,
)

PROBE_SCHEMA_VERSION = 2
DISCOVER_ROOTS = ("/root", "/opt", "/home/*", "/srv")


def part_error(exc: BaseException) -> str:
    """One line naming the exception and where it happened (the probe's own frame)."""
    import traceback  # only when a part failed

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (in {frames[-1].name}, line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def guarded(default: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as exc:
        out = dict(default)
        out["error"] = part_error(exc)
        return out


def discover_venvs(roots: tuple[str, ...] | None = None) -> list[str]:
    """Folders with bin/python and pyvenv.cfg at depth 1 or 2 under the roots (hidden too)."""
    found: list[str] = []

    def subdirs(path: str) -> list[str]:
        try:
            return sorted(e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
        except OSError:
            return []

    def is_venv(path: str) -> bool:
        return os.path.isfile(os.path.join(path, "pyvenv.cfg")) and os.path.lexists(
            os.path.join(path, "bin", "python")
        )

    for pattern in DISCOVER_ROOTS if roots is None else roots:
        for root in sorted(glob.glob(pattern)):
            for child in subdirs(root):
                if is_venv(child):
                    found.append(child)
                    continue
                found += [g for g in subdirs(child) if is_venv(g)]
    return found


def probe_venv(path: str, declared: bool, memo: Memo | None = None) -> dict[str, Any]:
    """Everything about one venv; problems go to its "error", never out of here."""
    memo = memo or Memo()
    # a venv is a folder with a python: a bare folder (one a tool made, say) is none
    python = os.path.join(path, "bin", "python")
    out: dict[str, Any] = {"path": path, "declared": declared,
                           "exists": os.path.isdir(path) and os.path.lexists(python)}
    if not out["exists"]:
        out["error"] = (f"{path}: no such directory" if not os.path.isdir(path)
                        else f"{path}: a folder without bin/python, not a venv")
        return out
    errors: list[str] = []
    sp = find_site_packages(path)
    out["site_packages"] = sp
    out["python_version"] = venv_python_version(path, sp)
    if sp is None:
        out["error"] = f"{path}: no lib/python3*/site-packages"
        return out
    dists, owners, problems = scan_distributions(sp, memo)
    out["distributions"] = dists
    errors += problems
    steps: list[tuple[str, Callable[[], None]]] = [
        ("torch", lambda: out.__setitem__("torch", torch_info(sp, dists))),
        ("nvidia", lambda: out.__setitem__("nvidia", nvidia_layout(sp))),
        ("extensions", lambda: _extensions(out, sp, owners, errors, memo)),
        ("sglang", lambda: out.__setitem__("sglang", _sglang(path, sp, dists, memo))),
        ("names", lambda: out.__setitem__("names", _names(sp, memo))),
    ]
    for name, step in steps:
        try:
            step()
        except Exception as exc:
            errors.append(f"{name}: {part_error(exc)}")
    out["error"] = "; ".join(errors) or None
    return out


def _extensions(out: dict[str, Any], sp: str, owners: dict[str, str], errors: list[str],
                memo: Memo) -> None:
    entries, problem = scan_extensions(sp, owners, memo=memo)
    out["extensions"] = entries
    if problem:
        errors.append(problem)


def _sglang(venv: str, sp: str, dists: dict[str, str], memo: Memo) -> dict[str, Any] | None:
    python = os.path.join(venv, "bin", "python")
    info = sglang_info(python, find_package_dir(sp, "sglang"), dists.get("sglang"), memo=memo)
    if info is not None:
        info["payload"] = payload_state(venv)
    return info


def _names(sp: str, memo: Memo) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for package, wanted in WANTED_NAMES.items():
        pkg_dir = find_package_dir(sp, package)
        if pkg_dir is not None:
            names[package] = exported_names(pkg_dir, wanted, memo)
    return names


def model_dir(path: str) -> dict[str, Any]:
    """A model folder's config.json (never the weights)."""
    entry: dict[str, Any] = {"path": path, "config": None, "error": None}
    cfg = os.path.join(path, "config.json")
    try:
        if os.path.getsize(cfg) > 4 << 20:
            raise ValueError("config.json is larger than 4 MiB")
        with open_regular(cfg) as fh:  # a FIFO there would hold the probe until it is killed
            data = json.loads(fh.read(4 << 20).decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("config.json is not a JSON object")
        entry["config"] = data
    except (OSError, ValueError) as exc:
        entry["error"] = f"{cfg}: {exc}"
    return entry


UNIT_DIR = "/etc/systemd/system"
MANAGED_LINE = "X-DDTreeDeploy-Managed=yes"
PENDING_DIR = "/var/lib/ddtree-deploy/pending-restart"
SERVICES_DIR = "/etc/ddtree-deploy/services"  # a service's secret files (service/endpoint.py)
DIGEST_NAME = "secrets.sha256"  # their digest, root-only


def secrets_digests() -> dict[str, Any]:
    """Each service's secrets digest (service stem -> digest), and the stems whose digest is
    there but cannot be read (the probe is not root): plan then reads the host state with
    sudo (converge/hoststate.py). Not an error of the part: nothing is unknown to plan."""
    out: dict[str, str] = {}
    unread: list[str] = []
    try:
        stems = sorted(os.listdir(SERVICES_DIR))
    except OSError:
        stems = []
    for stem in stems:
        path = os.path.join(SERVICES_DIR, stem, DIGEST_NAME)
        try:
            with open(path, encoding="utf-8") as fh:
                digest = fh.read(256).strip()
            # another form (the first tool's SHA-256) never matches: it is not sent back
            # (what the probe prints is shown at -vv; only scrypt's form is masked there)
            out[stem] = digest if digest.startswith("scrypt$") else "other"
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError):
            unread.append(stem)
    return {"digests": out, "unread": unread}


def tool_state() -> dict[str, Any]:
    """Units this tool created (their exact text), restarts an earlier run left pending and
    the services' secrets digests."""
    units: dict[str, str] = {}
    try:
        names = sorted(os.listdir(UNIT_DIR))
    except OSError:
        names = []
    for name in names:
        path = os.path.join(UNIT_DIR, name)
        if not name.endswith(".service") or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(1 << 20)
        except (OSError, UnicodeDecodeError):
            continue
        if MANAGED_LINE in text.splitlines():
            units[name] = text
    try:
        pending = sorted(os.listdir(PENDING_DIR))
    except OSError:
        pending = []
    secrets = secrets_digests()
    return {"managed_units": units, "pending_restarts": pending,
            "secrets_digests": secrets["digests"], "secrets_unread": secrets["unread"],
            "error": None}


def gather(
    venvs: list[str], discover: bool, host_name: str | None, models: list[str] | None = None,
    memo_path: str | None = None, memo_code: str = "",
) -> dict[str, Any]:
    """Every part's facts. memo_path: where the host keeps what the probe derived from files
    (facts_memo.py); None: derive everything again."""
    start = time.monotonic()
    memo = Memo(memo_path, memo_code)
    declared = [os.path.normpath(v) for v in venvs]
    found = [v for v in discover_venvs() if v not in declared] if discover else []
    all_venvs = [(v, True) for v in dict.fromkeys(declared)] + [(v, False) for v in found]
    facts: dict[str, Any] = {"schema_version": PROBE_SCHEMA_VERSION, "host": host_name or ""}
    facts["host_info"] = guarded({}, lambda: host_info([v for v, _ in all_venvs]))
    tcp: dict[str, Any] = guarded({"listeners": []}, lambda: _listeners_part())
    ports_by_pid: dict[int, list[int]] = {}
    for sock in tcp["listeners"]:
        if sock.get("pid"):
            ports_by_pid.setdefault(sock["pid"], []).append(sock["port"])
    facts["nvidia"] = guarded({"present": False}, lambda: nvidia_info(ports_by_pid))
    gpu_pids = [p["pid"] for g in facts["nvidia"].get("gpus", []) for p in g["processes"]]
    facts["services"] = guarded(
        {"listeners": tcp["listeners"]}, lambda: services(gpu_pids, tcp["listeners"])
    )
    if tcp.get("error"):
        prior = facts["services"].get("error")
        facts["services"]["error"] = "; ".join(e for e in (prior, tcp["error"]) if e)
    facts["venvs"] = [_venv_part(v, d, memo) for v, d in all_venvs]
    facts["models"] = [model_dir(m) for m in dict.fromkeys(models or [])]
    facts["tool"] = guarded({"managed_units": {}, "pending_restarts": []}, tool_state)
    memo.save()
    facts["probe_memo"] = memo.report()
    facts["duration_s"] = elapsed(start)
    return facts


def _venv_part(path: str, declared: bool, memo: Memo) -> dict[str, Any]:
    return guarded({"path": path, "declared": declared}, lambda: probe_venv(path, declared, memo))


def _listeners_part() -> dict[str, Any]:
    found, error = listeners()
    return {"listeners": found, "error": error}


_VALUED = {"--venv": "venv", "--model": "model", "--host-name": "host_name",
           "--memo-code": "memo_code"}
_FLAGS = {"--discover": "discover", "--no-memo": "no_memo"}


def parse_args(argv: list[str]) -> dict[str, Any]:
    """The probe's options; anything else (or --help) goes to argparse, loaded only then, which
    prints the usage (exit 2 on an error)."""
    opts: dict[str, Any] = {"venv": [], "model": [], "host_name": None, "memo_code": "",
                            "discover": False, "no_memo": False}  # fmt: skip
    args = iter(argv)
    for arg in args:
        key, eq, value = arg.partition("=")
        if key in _VALUED:
            if not eq:
                value = next(args, None)  # type: ignore[assignment]
                if value is None:
                    return _argparse(argv)
            dest = _VALUED[key]
            if isinstance(opts[dest], list):
                opts[dest].append(value)
            else:
                opts[dest] = value
        elif arg in _FLAGS:
            opts[_FLAGS[arg]] = True
        else:
            return _argparse(argv)
    return opts


def _argparse(argv: list[str]) -> dict[str, Any]:
    import argparse

    parser = argparse.ArgumentParser(prog="ddtree-probe", description="Print this host's facts.")
    parser.add_argument("--venv", action="append", default=[], help="a declared venv (repeat)")
    parser.add_argument("--discover", action="store_true", help="also look for venvs")
    parser.add_argument("--host-name", default=None, help="the host's name in hosts.yaml")
    parser.add_argument("--model", action="append", default=[], help="a model folder (repeat)")
    parser.add_argument("--no-memo", action="store_true",
                        help="derive everything again (ignore and keep no " + MEMO_PATH + ")")
    parser.add_argument("--memo-code", default="", help="the probe's version (its hash)")
    return vars(parser.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    facts = gather(args["venv"], args["discover"], args["host_name"], args["model"],
                   None if args["no_memo"] else MEMO_PATH, args["memo_code"])
    sys.stdout.write(json.dumps(facts, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0
