"""The probe's memory on the host: what it derived from files, reused while those files are
unchanged.

Reading every dist-info RECORD, every shared object's ELF header, sglang's spec_info.py (in
the venv's own interpreter) and flashinfer's __init__.py costs the same each time although
these files rarely change. Each result is kept with the files it was derived from and their
signatures (size, mtime_ns, ctime_ns, inode; ctime moves on any write, rename or `cp -p`, and
no user can set it back), and is reused only while every signature still matches. A file
that was absent is remembered as absent, so its appearance counts as a change.

Kept in ~/.cache/ddtree-deploy/probe-memo.json of the user the probe runs as, written
atomically, and only with the entries this run used (so it never grows past one run's worth).
A memo that cannot be read starts empty; one that cannot be written is reported, never fatal.
Part of the probe bundle (remote/bundle.py): stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

MEMO_VERSION = 1
MEMO_PATH = "~/.cache/ddtree-deploy/probe-memo.json"
MEMO_MAX_BYTES = 64 << 20


def file_sig(path: str) -> list[int] | None:
    """What tells a file's content changed without reading it; None when it is absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class Memo:
    """Derived values keyed by (kind, key), each valid while its files are unchanged, and all of
    them only for the probe code and interpreter that derived them (`code`: the probe's hash;
    a memo written by another version or another python is dropped whole)."""

    def __init__(self, path: str | None = None, code: str = "") -> None:
        self.path = os.path.expanduser(path) if path else None
        self.code = f"{code}|{sys.version}"
        self.old: dict[str, Any] = {}
        self.new: dict[str, Any] = {}
        self.hits = 0
        self.misses = 0
        self.error: str | None = None
        if self.path:
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        try:
            if os.path.getsize(self.path) > MEMO_MAX_BYTES:
                return
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return  # absent or unreadable: start empty
        if (isinstance(data, dict) and data.get("version") == MEMO_VERSION
                and data.get("code") == self.code):
            entries = data.get("entries")
            self.old = entries if isinstance(entries, dict) else {}

    def derive(self, kind: str, key: str, deps: list[str], fn: Callable[..., Any], *args: Any,
               keep: Callable[[Any], bool] | None = None) -> Any:
        """fn(*args)'s value, computed from the files `deps` and nothing else (a JSON value).
        keep(value) False: use the value but do not remember it (e.g. a timeout)."""

        def compute(track: Callable[[str], None]) -> Any:
            for dep in deps:  # signed before reading: a write while fn reads races safely
                track(dep)
            return fn(*args)

        return self.derive_tracked(kind, key, compute, keep=keep)

    def derive_tracked(self, kind: str, key: str, fn: Callable[[Callable[[str], Any]], Any],
                       keep: Callable[[Any], bool] | None = None) -> Any:
        """Like derive when the files are found while computing: fn(track) calls track(path)
        for each file it is about to read or look for (track returns the file's signature)."""
        full = kind + "\0" + key
        old = self.old.get(full)
        if isinstance(old, dict) and "value" in old and self._valid(old.get("deps")):
            return self._hit(full, old)
        signed: list[list[Any]] = []

        def track(path: str) -> list[int] | None:
            sig = file_sig(path)
            signed.append([path, sig])
            return sig

        value = fn(track)
        if keep is not None and not keep(value):
            self.misses += 1
            return value
        return self._store(full, signed, value)

    @staticmethod
    def _valid(deps: Any) -> bool:
        if not isinstance(deps, list):
            return False
        return all(isinstance(d, list) and len(d) == 2 and file_sig(d[0]) == d[1] for d in deps)

    def _hit(self, full: str, old: dict[str, Any]) -> Any:
        self.hits += 1
        self.new[full] = old
        return old["value"]

    def _store(self, full: str, signed: list[list[Any]], value: Any) -> Any:
        self.misses += 1
        # as JSON will give it back next time (tuples become lists): same answer either way
        value = json.loads(json.dumps(value))
        self.new[full] = {"deps": signed, "value": value}
        return value

    def save(self) -> None:
        """Write the entries this run used, if they differ from what was read."""
        if not self.path or self.new == self.old:
            return
        folder = os.path.dirname(self.path)
        tmp = None
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            tmp = os.path.join(folder, f".probe-memo.{os.getpid()}.{time.time_ns()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": MEMO_VERSION, "code": self.code, "entries": self.new}, fh)
            os.replace(tmp, self.path)
            tmp = None
        except OSError as exc:
            self.error = f"cannot write {self.path}: {exc.strerror or exc}"
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def report(self) -> dict[str, Any]:
        return {"path": self.path, "hits": self.hits, "misses": self.misses, "error": self.error}
