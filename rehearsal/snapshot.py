"""An earlier payload beside the current one, for the A/B of phase ``perf-8b``.

    python -m rehearsal.snapshot REF          # repo root: writes .payload-ab/ (git-ignored)

Writes the ``payload/`` folder of commit ``REF`` to ``.payload-ab/`` (what was there is
replaced) with ``SOURCE``: the commit and its subject. Carry ``.payload-ab`` with the device call
(``carry: [".carry", ".payload-ab"]``): the rehearsal then deploys it into a copy of the venv's
sglang and serves DDTREE 15/8 from it beside the current payload (``rehearsal.perf8b``).
Exit codes: 0 written, 1 git refused (an unknown REF), 2 usage.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from rehearsal.perf8b import SNAPSHOT

REPO = Path(__file__).resolve().parents[1]


def write(ref: str, dest: Path, repo: Path = REPO) -> str:
    """Extract ``ref``'s payload/ into ``dest``; returns the SOURCE line written."""
    def git(*args: str) -> bytes:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.decode(errors="replace").strip() or f"git {args[0]}")
        return done.stdout

    sha = git("rev-parse", "--verify", f"{ref}^{{commit}}").decode().strip()
    data = git("archive", "--format=tar", f"{sha}:payload")
    subject = git("log", "-1", "--format=%s", sha).decode().strip()
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Debian 12's Python (3.11.2, as in CI) predates extraction filters
            tar.extractall(dest)
    line = f"{sha} {subject}"
    (dest / "SOURCE").write_text(line + "\n", encoding="utf-8")
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rehearsal.snapshot")
    ap.add_argument("ref", help="the commit whose payload/ is the A/B's earlier payload")
    ap.add_argument("--dest", type=Path, default=REPO / SNAPSHOT)
    a = ap.parse_args(argv)
    try:
        line = write(a.ref, a.dest)
    except RuntimeError as exc:
        print(f"snapshot: {exc}", file=sys.stderr)
        return 1
    print(f"{a.dest}: payload of {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
