"""The target side of the overlay, part 1: paths, journal, lock, history, restore, recovery.

Stdlib only, Python >= 3.8 syntax: bundled with facts_elf.py, overlay_apply_checks.py and
overlay_apply.py into one script by remote/bundle.py (see overlay_apply.py for the design).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import sysconfig
import time
from typing import Any

STATE = os.path.join(".ddtree-deploy", "overlay")
ACTIVE = ("planned", "backing-up", "swapping", "checking", "rolling-back")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_SPACE, EXIT_BUSY = 0, 1, 2, 5, 6
NEW_SUFFIX = ".ddtree-new"
LOCK_WAIT = 15.0
_steps: dict[str, int] = {}
_kill_at = int(os.environ.get("DDTREE_DEPLOY_FAULT_STEP", "0") or "0")


class Fail(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED, result: str = "failed") -> None:
        super().__init__(message)
        self.message, self.code, self.result = message, code, result


def step(phase: str) -> None:
    """A point where work is durable; DDTREE_DEPLOY_FAULT_STEP=N SIGKILLs us at the Nth."""
    _steps[phase] = _steps.get(phase, 0) + 1
    if _kill_at and sum(_steps.values()) == _kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def write_json(path: str, data: Any) -> None:
    """Atomically: a temporary file, fsync, rename, fsync of the folder."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise Fail(f"cannot read {path}: {exc}") from exc


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def link_or_copy(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.lexists(dst):
        os.unlink(dst)
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:  # another file system, or links refused: copy (counted by the space check)
        shutil.copy2(src, dst, follow_symlinks=False)


class Site:
    """The target venv: where RECORD paths land and where the overlay keeps its state."""

    def __init__(self, venv: str, site: str | None, create: bool = True) -> None:
        """``create``: make the state folders (False for a read: history writes nothing)."""
        self.venv = os.path.realpath(venv)
        if not os.path.isdir(self.venv):
            raise Fail(f"venv not found: {venv}", EXIT_USAGE)
        if site is None:
            if os.path.realpath(sys.prefix) == self.venv:
                site = sysconfig.get_paths()["purelib"]
            else:
                base = {"base": self.venv, "platbase": self.venv}
                site = sysconfig.get_paths("posix_prefix", vars=base)["purelib"]
        self.site = os.path.realpath(site)
        self.dir = os.path.join(self.venv, STATE)
        if os.path.realpath(self.dir) != self.dir:  # a symlink on the way leads elsewhere
            raise Fail(f"refusing: {self.dir} is not a folder of the venv itself", EXIT_USAGE)
        for sub in ("backups", "staging", "results", "requests") if create else ():
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self.journal = os.path.join(self.dir, "journal.json")
        self.protected = {self.venv, self.site, os.path.dirname(self.site),
                          os.path.join(self.venv, "bin"), os.path.join(self.venv, "lib")}

    def rel(self, record_path: str) -> str:
        """A RECORD path -> the path relative to the venv; refuses anything leaving it."""
        if not record_path or os.path.isabs(record_path) or "\0" in record_path:
            raise Fail(f"bad RECORD path: {record_path!r}", EXIT_USAGE)
        full = os.path.normpath(os.path.join(self.site, record_path))
        if not self.inside(full):
            raise Fail(f"RECORD path leaves the venv: {record_path!r}", EXIT_USAGE)
        return os.path.relpath(full, self.venv)

    def inside(self, path: str) -> bool:
        """Whether writing or deleting `path` stays in the venv (not in its state folder)
        once every symlink on the way is resolved: its folder resolved, the name itself
        (which is replaced or unlinked, never followed) kept."""
        path = os.path.normpath(path)
        real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        for p in (path, real):
            if not p.startswith(self.venv + os.sep) or p.startswith(self.dir + os.sep):
                return False
        return True

    def abs(self, rel: str) -> str:
        return os.path.join(self.venv, rel)

    def history(self, entry: dict[str, Any]) -> None:
        with open(os.path.join(self.dir, "history.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(dict(entry, time=now()), sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def result(self, token: str | None, data: dict[str, Any]) -> None:
        if token:
            write_json(os.path.join(self.dir, "results", token + ".json"), dict(data, token=token))

    def prune_dirs(self, rels: Any) -> None:
        """Remove folders that deleting `rels` left empty (never the venv's own folders)."""
        for folder in sorted({os.path.dirname(self.abs(r)) for r in rels}, key=len, reverse=True):
            while folder.startswith(self.venv + os.sep) and folder not in self.protected:
                try:
                    os.rmdir(folder)
                except OSError:
                    break
                folder = os.path.dirname(folder)


# -- locking and recovery -----------------------------------------------------------------


def take_lock(site: Site, command: str, wait: float) -> int | None:
    """The overlay lock (flock), holder written in it; None when busy after `wait` s."""
    fd = os.open(os.path.join(site.dir, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.1)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": now(), "command": command}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
    except OSError:  # a full disk: the lock still holds, only its label is missing
        pass
    return fd


def holder(site: Site) -> Any:
    try:
        with open(os.path.join(site.dir, "lock"), encoding="utf-8") as fh:
            return json.loads(fh.read() or "null")
    except (OSError, ValueError):
        return None


def restore(site: Site, bdir: str, man: dict[str, Any]) -> None:
    """Put back every saved file and remove every placed one; idempotent, so a crash
    during it is finished by the next run."""
    saved = set(man["saved"])
    files = os.path.join(bdir, "files")
    for rel, _sha in man["placed"]:
        path = site.abs(rel)
        if os.path.lexists(path + NEW_SUFFIX):
            os.unlink(path + NEW_SUFFIX)
        if rel not in saved and os.path.lexists(path):
            os.unlink(path)
            step("rolling-back")
    for rel in man["saved"]:
        src = os.path.join(files, rel)
        if os.path.lexists(src):
            os.makedirs(os.path.dirname(site.abs(rel)), exist_ok=True)
            os.replace(src, site.abs(rel))  # a no-op when both are links of one file
            step("rolling-back")
    site.prune_dirs([rel for rel, _ in man["placed"]])


def roll_back(site: Site, name: str, reason: str, token: str | None) -> None:
    bdir = os.path.join(site.dir, "backups", name)
    man = read_json(os.path.join(bdir, "manifest.json"))
    journal = read_json(site.journal) or {}
    write_json(site.journal, dict(journal, phase="rolling-back", reason=reason, time=now()))
    step("rolling-back")
    if man is not None:
        restore(site, bdir, man)
        man["state"] = "rolled-back"
        write_json(os.path.join(bdir, "manifest.json"), man)
    write_json(site.journal, dict(journal, phase="rolled-back", reason=reason, time=now()))
    step("rolled-back")
    lane, plan_id = journal.get("lane"), journal.get("plan_id")
    site.history({"op": journal.get("op"), "lane": lane, "plan_id": plan_id,
                  "result": "rolled-back", "detail": reason, "backup": name})
    site.result(token, {"op": journal.get("op"), "result": "rolled-back", "message": reason,
                        "plan_id": plan_id, "backup": name})
    shutil.rmtree(bdir, ignore_errors=True)


def recover(site: Site) -> dict[str, Any] | None:
    """Finish what a killed run left: roll back whatever it was doing."""
    journal = read_json(site.journal)
    if not journal or journal.get("phase") not in ACTIVE:
        return None
    what = f"interrupted during {journal['phase']} (pid {journal.get('pid')})"
    if journal.get("op") == "rollback" or journal["phase"] == "rolling-back":
        what = "finished an interrupted rollback"
    roll_back(site, journal["backup"], "recovery: " + what, journal.get("token"))
    return {"backup": journal["backup"], "detail": what}


def applied_backups(site: Site) -> list[str]:
    root = os.path.join(site.dir, "backups")
    names = []
    for name in sorted(os.listdir(root)):
        man = read_json(os.path.join(root, name, "manifest.json"))
        if man and man.get("state") == "applied":
            names.append(name)
        else:  # left by a run killed before its journal named it, or already rolled back
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return names


def prune_backups(site: Site, keep: int) -> None:
    for name in applied_backups(site)[: -max(keep, 1)]:
        shutil.rmtree(os.path.join(site.dir, "backups", name), ignore_errors=True)


def read_history(site: Site) -> list[Any]:
    path = os.path.join(site.dir, "history.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                out.append(json.loads(line))
            except ValueError:  # a line cut short by a kill
                continue
    return out

