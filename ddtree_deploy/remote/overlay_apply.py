"""Apply an overlay on the target: run there with the venv's python, stdlib only.

    python overlay_apply.py --venv V [--token T] apply REQUEST.json | rollback | history
    python overlay_apply.py --venv V [--token T [--wait SECONDS]] status

Crash-consistent by construction. Everything lives inside the venv
(<venv>/.ddtree-deploy/overlay), so staging, backups and site-packages share one file
system and every move is a rename or a hard link: the swap needs no room for data
copies, only for the metadata (the free-space check counts copies where a link fails
across file systems). Order: free-space and staging checks (nothing touched) ->
journal `planned` -> `backing-up` (hard-link every old file into backups/<id>/files,
site-packages untouched) -> `swapping` (link each staged blob to <path>.ddtree-new,
rename over <path>; delete old-only files) -> `checking` -> `done`; any failure ->
`rolling-back` -> `rolled-back`. A run that finds the journal mid-way (its holder was
killed: the flock is free) rolls back first, so site-packages is old or new, as a whole.
Part of a bundle (remote/bundle.py's OVERLAY_APPLY: facts_elf.py, overlay_apply_state.py,
overlay_apply_checks.py, then this): Python >= 3.8 syntax.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import sys
import time
from typing import Any

from ddtree_deploy.remote.overlay_apply_checks import _SO, run_checks
from ddtree_deploy.remote.overlay_apply_state import (
    ACTIVE,
    EXIT_BUSY,
    EXIT_FAILED,
    EXIT_NO_SPACE,
    EXIT_OK,
    EXIT_USAGE,
    LOCK_WAIT,
    NEW_SUFFIX,
    Fail,
    Site,
    _steps,
    applied_backups,
    holder,
    link_or_copy,
    now,
    prune_backups,
    read_history,
    read_json,
    recover,
    roll_back,
    sha256_of,
    step,
    take_lock,
    write_json,
)


def prepare(site: Site, req: dict[str, Any]) -> dict[str, Any]:
    """Everything checked before anything is touched; the manifest of the backup."""
    plan = req["plan"]
    want = os.path.realpath(plan["target"]["venv"])
    if want != site.venv:
        raise Fail(f"the plan is for venv {want}, not {site.venv}", EXIT_USAGE)
    staging = os.path.join(site.dir, "staging", plan["id"], "blobs")
    placed: dict[str, str] = {}
    keep: set[str] = set()
    deletes: set[str] = set()
    backups: set[str] = set()
    blobs: dict[str, int] = {}
    mine = {c["name"] for c in plan["changes"]}
    for change in plan["changes"]:
        for entry in change["send"]:
            placed[site.rel(entry["path"])] = entry["sha256"]
            blobs[entry["sha256"]] = entry["size"]
        for entry in change["keep"]:
            rel = site.rel(entry["path"])
            placed[rel] = entry["sha256"]
            path = site.abs(rel)
            ok = os.path.isfile(path) and os.path.getsize(path) == entry["size"]
            if ok and (change["action"] == "same" or sha256_of(path) == entry["sha256"]):
                keep.add(rel)
            else:  # the target changed since the plan: send it after all, if staged
                blobs[entry["sha256"]] = entry["size"]
        deletes.update(site.rel(p) for p in change["delete"])
        backups.update(site.rel(p) for p in change["backup"])
    verified = verified_on_arrival(os.path.dirname(staging))
    for sha, size in blobs.items():
        blob = os.path.join(staging, sha)
        if not os.path.isfile(blob) or os.path.getsize(blob) != size:
            raise Fail(f"staged file {sha} is missing or has the wrong size; run the transfer "
                       "again")
        st = os.stat(blob)
        if verified.get(sha) == (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns):
            continue  # hashed by the receiver as it arrived, untouched since (ctime)
        if req.get("verify", True) and sha256_of(blob) != sha:
            raise Fail(f"staged file {sha} does not match its sha256; run the transfer again")
    others = owned_by_others(site, mine)
    deletes = {d for d in deletes if d not in placed and d not in others}
    deletes = {d for d in deletes if os.path.lexists(site.abs(d))}
    saved = sorted(p for p in backups | set(placed) if os.path.lexists(site.abs(p)))
    check_space(site, staging, placed, keep, saved, blobs, int(req.get("reserve", 64 << 20)))
    return {"plan_id": plan["id"], "lane": plan["lane"], "venv": site.venv, "site": site.site,
            "state": "applying", "created": now(), "saved": saved, "delete": sorted(deletes),
            "placed": sorted([rel, sha] for rel, sha in placed.items()), "keep": sorted(keep),
            "staging": staging, "dists": {c["name"]: [c["old_version"], c["new_version"]]
                                          for c in plan["changes"]}}


def verified_on_arrival(staging: str) -> dict[str, tuple[int, ...]]:
    """sha -> (size, inode, mtime_ns, ctime_ns) of each blob the receiver hashed on arrival
    (staging/verified.jsonl; see remote/overlay_transfer.py)."""
    out: dict[str, tuple[int, ...]] = {}
    try:
        with open(os.path.join(staging, "verified.jsonl"), encoding="utf-8") as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                    out[str(r[0])] = tuple(int(x) for x in r[1:5])
                except (ValueError, IndexError, TypeError):
                    continue  # a line cut short by a kill: that blob is hashed again
    except OSError:
        pass
    return out


def owned_by_others(site: Site, mine: set[str]) -> set[str]:
    """Paths in the RECORD of installed distributions the plan does not touch."""
    out: set[str] = set()
    for entry in os.listdir(site.site):
        if not entry.endswith(".dist-info"):
            continue
        name = re.sub(r"[-_.]+", "-", entry[: -len(".dist-info")].rsplit("-", 1)[0]).lower()
        if name in mine:
            continue
        try:
            with open(os.path.join(site.site, entry, "RECORD"), encoding="utf-8") as fh:
                for line in fh:
                    path = line.rsplit(",", 2)[0].strip().strip('"')
                    if path:
                        out.add(os.path.relpath(os.path.normpath(
                            os.path.join(site.site, path)), site.venv))
        except OSError:
            continue
    return out


def check_space(site: Site, staging: str, placed: dict[str, str], keep: set[str],
                saved: list[str], blobs: dict[str, int], reserve: int) -> None:
    """Free space first: links need none, copies (across file systems) need their size."""
    dev = os.stat(site.site).st_dev
    need = reserve
    if os.path.isdir(staging) and os.stat(staging).st_dev != dev:
        need += sum(blobs.get(sha, 0) for rel, sha in placed.items() if rel not in keep)
    if os.stat(site.dir).st_dev != dev:
        need += sum(os.lstat(site.abs(p)).st_size for p in saved)
    st = os.statvfs(site.site)
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise Fail(f"not enough free space on the file system of {site.venv}: "
                   f"{free >> 20} MiB free, the swap needs {need >> 20} MiB (a reserve of "
                   f"{reserve >> 20} MiB included); nothing was changed", EXIT_NO_SPACE,
                   "no-space")


def wanted_mode(site: Site, rel: str, blob: str) -> int:
    path = site.abs(rel)
    old_exec = os.path.isfile(path) and os.stat(path).st_mode & 0o111
    blob_exec = os.stat(blob).st_mode & 0o111
    if rel.startswith("bin" + os.sep) or old_exec or blob_exec or _SO.search(rel):
        return 0o755
    return 0o644


def swap(site: Site, man: dict[str, Any]) -> None:
    files = os.path.join(site.dir, "backups", man["backup"], "files")
    for rel in man["saved"]:
        link_or_copy(site.abs(rel), os.path.join(files, rel))
        step("backing-up")
    write_json(site.journal, dict(read_json(site.journal), phase="swapping", time=now()))
    step("swapping")
    modes: dict[str, int] = {}
    keep = set(man["keep"])
    for rel, sha in man["placed"]:
        if rel in keep:
            continue
        blob, dst = os.path.join(man["staging"], sha), site.abs(rel)
        mode = wanted_mode(site, rel, blob)
        if modes.setdefault(sha, mode) == mode:
            link_or_copy(blob, dst + NEW_SUFFIX)
        else:  # the same content wanted with two modes: a copy, not a shared inode
            shutil.copyfile(blob, dst + NEW_SUFFIX)
        os.chmod(dst + NEW_SUFFIX, mode)
        os.replace(dst + NEW_SUFFIX, dst)
        step("swapping")
    for rel in man["delete"]:
        if os.path.lexists(site.abs(rel)):
            os.unlink(site.abs(rel))
            step("swapping")
    site.prune_dirs(man["delete"])


def new_backup(site: Site, stem: str) -> str:
    """A backup folder of its own: `stem`, or `stem.N` where a run killed before its journal
    named its folder left one of that name (a retry within the same second)."""
    name, n = stem, 1
    while True:
        try:
            os.makedirs(os.path.join(site.dir, "backups", name, "files"))
            return name
        except FileExistsError:
            n += 1
            name = f"{stem}.{n}"


def do_apply(site: Site, req: dict[str, Any], token: str | None) -> dict[str, Any]:
    plan = req["plan"]
    journal = read_json(site.journal) or {}
    if journal.get("phase") == "done" and journal.get("plan_id") == plan["id"]:
        return {"result": "unchanged", "plan_id": plan["id"], "lane": plan["lane"],
                "message": f"plan {plan['id'][:12]} is already applied"}
    man = prepare(site, req)
    if not man["delete"] and len(man["keep"]) == len(man["placed"]):
        return {"result": "unchanged", "plan_id": plan["id"], "lane": plan["lane"],
                "message": "the target already has every file of the plan"}
    name = new_backup(site, f"{time.strftime('%Y%m%dT%H%M%S')}-{plan['lane']}-{plan['id'][:8]}")
    man["backup"] = name
    bdir = os.path.join(site.dir, "backups", name)
    write_json(os.path.join(bdir, "manifest.json"), man)
    base = {"op": "apply", "plan_id": plan["id"], "lane": plan["lane"], "backup": name,
            "token": token, "pid": os.getpid(), "started": now()}
    write_json(site.journal, dict(base, phase="planned", time=now()))
    step("planned")
    write_json(site.journal, dict(base, phase="backing-up", time=now()))
    step("backing-up")
    try:
        swap(site, man)
        write_json(site.journal, dict(base, phase="checking", time=now()))
        step("checking")
        checks = run_checks(site, man, req.get("checks") or {})
    except OSError as exc:
        checks = [{"check": "swap", "ok": False, "detail": str(exc)}]
    failed = [c for c in checks if not c["ok"]]
    if failed:
        reason = "; ".join(f"{c['check']}: {c['detail']}" for c in failed)
        roll_back(site, name, "check failed: " + reason, None)
        raise Fail("check failed, rolled back: " + reason, EXIT_FAILED, "rolled-back")
    man["state"] = "applied"
    write_json(os.path.join(bdir, "manifest.json"), man)
    write_json(site.journal, dict(base, phase="done", time=now()))
    step("done")
    site.history(dict(base, result="applied", detail=f"{len(man['placed'])} files placed"))
    shutil.rmtree(os.path.join(site.dir, "staging", plan["id"]), ignore_errors=True)
    prune_backups(site, int(req.get("keep_backups", 2)))
    return {"result": "applied", "backup": name, "checks": checks,
            "message": f"{len(man['placed'])} files placed, {len(man['delete'])} removed"}


def do_rollback(site: Site, token: str | None) -> dict[str, Any]:
    names = applied_backups(site)
    if not names:
        raise Fail(f"nothing to roll back: no applied overlay has a backup in {site.venv}")
    man = read_json(os.path.join(site.dir, "backups", names[-1], "manifest.json"))
    write_json(site.journal, {"op": "rollback", "plan_id": man["plan_id"], "lane": man["lane"],
                              "backup": names[-1], "token": token, "pid": os.getpid(),
                              "phase": "rolling-back", "time": now()})
    roll_back(site, names[-1], "rollback requested", None)
    return {"result": "rolled-back", "backup": names[-1], "plan_id": man["plan_id"],
            "message": f"restored the venv as it was before plan {man['plan_id'][:12]}"}


def interrupted(site: Site) -> bool:
    try:
        return (read_json(site.journal) or {}).get("phase") in ACTIVE
    except Fail:
        return True


def await_file(path: str, seconds: float) -> None:
    """Return once `path` exists, or after `seconds` (a local poll: the workstation's status
    call learns of the result within 20 ms instead of at its next round trip)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


def dispatch(site: Site, args: argparse.Namespace, out: dict[str, Any]) -> None:
    if args.command == "history":
        out["history"] = read_history(site)
        return
    fd = take_lock(site, args.command, LOCK_WAIT if args.command != "status" else 0)
    if fd is None:
        if args.command != "status":
            raise Fail(f"another overlay operation is running: {holder(site)}", EXIT_BUSY, "busy")
        out.update(running=True, holder=holder(site), journal=read_json(site.journal))
        return
    try:
        out["recovered"] = recover(site)
        if args.command == "apply":
            if not args.request:
                raise Fail("apply needs the request file", EXIT_USAGE)
            out.update(do_apply(site, read_json(args.request) or {}, args.token))
        elif args.command == "rollback":
            out.update(do_rollback(site, args.token))
        else:
            out.update(running=False, journal=read_json(site.journal))
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="apply_remote")
    parser.add_argument("--venv", required=True)
    parser.add_argument("--site-packages")
    parser.add_argument("--token")
    parser.add_argument("--wait", type=float, default=0.0,
                        help="status: first wait up to this many seconds for the run's result")
    parser.add_argument("command", choices=("apply", "rollback", "status", "history"))
    parser.add_argument("request", nargs="?")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"op": args.command, "result": "ok"}
    code, site = EXIT_OK, None
    if args.command == "history" and not os.path.isdir(args.venv):  # a read: nothing to say
        out.update(history=[], message=f"venv not found: {args.venv}")
        print(json.dumps(out))
        return code
    try:
        site = Site(args.venv, args.site_packages, create=args.command != "history")
        if args.command == "status" and args.token and args.wait > 0:
            await_file(os.path.join(site.dir, "results", args.token + ".json"), args.wait)
        dispatch(site, args, out)
    except Fail as exc:
        out.update(result=exc.result, message=exc.message)
        code = exc.code
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        out.update(result="failed", message=f"malformed request: {type(exc).__name__}: {exc}")
        code = EXIT_USAGE
    except OSError as exc:
        out.update(result="failed", message=f"I/O error: {exc}")
        code = EXIT_FAILED
        if exc.errno == errno.ENOSPC and site is not None:
            code, out["result"] = EXIT_NO_SPACE, "no-space"
            out["message"] = f"no space left on the file system of {site.venv}; " + (
                "nothing was changed" if not interrupted(site) else
                "the run stopped mid-way: the next apply, rollback or status rolls it back")
    out["steps"] = _steps
    if site is not None and args.command in ("apply", "rollback"):
        try:
            if args.command == "apply" and out["result"] not in ("applied", "rolled-back"):
                site.history({"op": "apply", "result": out["result"], "detail": out["message"],
                              "lane": out.get("lane"), "plan_id": out.get("plan_id")})
            site.result(args.token, out)
        except OSError:
            pass
    if site is not None and args.command == "status" and args.token:
        out["token_result"] = read_json(os.path.join(site.dir, "results", args.token + ".json"))
    print(json.dumps(out))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
