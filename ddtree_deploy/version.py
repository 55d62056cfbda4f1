"""The tool's version line: the release and the commit it was built from.

In a git checkout (an editable install, `uv run`) the commit is git's HEAD (read from the
git folder, no git process; uncommitted changes are not told); an installed wheel carries
the commit its build saw in ddtree_deploy/_data/COMMIT (written by
hatch_build.py); neither: `unknown`.
"""

from __future__ import annotations

import re
from pathlib import Path

from ddtree_deploy import __version__

_PKG = Path(__file__).resolve().parent
_CHECKOUT = _PKG.parent
BUILT_COMMIT = _PKG / "_data" / "COMMIT"
_HEX = re.compile(r"[0-9a-f]{7,64}")


def _git_dir(checkout: Path) -> Path | None:
    """The checkout's git folder: `.git`, or where a worktree's `.git` file points."""
    dot = checkout / ".git"
    if dot.is_dir():
        return dot
    try:
        line = dot.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not line.startswith("gitdir:"):
        return None
    path = Path(line.removeprefix("gitdir:").strip())
    return path if path.is_absolute() else checkout / path


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _head(checkout: Path) -> str | None:
    """HEAD's commit, read from the git folder's files (no git process: `--version` stays
    fast, and runs where git is not installed): a detached HEAD, a loose ref, packed-refs."""
    git = _git_dir(checkout)
    if git is None:
        return None
    head = _read(git / "HEAD")
    if head is None:
        return None
    if not head.startswith("ref:"):
        return head
    ref = head.removeprefix("ref:").strip()
    common = _read(git / "commondir")  # a worktree's refs live in the main checkout's folder
    folders = [git] + ([git / common if not Path(common).is_absolute() else Path(common)]
                       if common else [])
    for folder in folders:
        loose = _read(folder / ref)
        if loose:
            return loose
        for line in (_read(folder / "packed-refs") or "").splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    return None


def commit() -> str:
    """The commit this copy of the tool runs from (12 hex digits), or `unknown`."""
    head = _head(_CHECKOUT)
    if head is not None:
        return head[:12] if _HEX.fullmatch(head) else "unknown"
    built = _read(BUILT_COMMIT)
    return built if built and _HEX.fullmatch(built) else "unknown"


def version_line() -> str:
    return f"ddtree-deploy {__version__} (commit {commit()})"
