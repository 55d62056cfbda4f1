"""The tool's version line: the release and the commit it was built from.

In a git checkout (an editable install, `uv run`) the commit is git's HEAD, with `+dirty` when
tracked files differ from it; an installed wheel carries the commit its build saw in
ddtree_deploy/_data/COMMIT (written by hatch_build.py); neither: `unknown`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ddtree_deploy import __version__

_PKG = Path(__file__).resolve().parent
_CHECKOUT = _PKG.parent
BUILT_COMMIT = _PKG / "_data" / "COMMIT"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(_CHECKOUT), *args], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> str:
    """The commit this copy of the tool runs from (12 hex digits, `+dirty`), or `unknown`."""
    if (_CHECKOUT / ".git").exists():
        head = _git("rev-parse", "--short=12", "HEAD")
        if head:
            dirty = _git("status", "--porcelain", "--untracked-files=no")
            return head + ("+dirty" if dirty else "")
    try:
        built = BUILT_COMMIT.read_text(encoding="utf-8").strip()
    except OSError:
        return "unknown"
    return built if built and len(built) <= 64 and built.isprintable() else "unknown"


def version_line() -> str:
    return f"ddtree-deploy {__version__} (commit {commit()})"
