"""Processes on this machine: whether a PID still runs."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs here (one owned by another user counts; a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
