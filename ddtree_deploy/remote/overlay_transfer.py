"""How the overlay transfer runs its host-side scripts: the scripts and the shell around them.

The scripts are modules of this folder: overlay_source_tar.py on the source, and on the target
overlay_staging_check.py and overlay_staging_receive.py (each bundled after the guard in
overlay_staging.py). Each runs as ``PYTHON -c SCRIPT ARGS`` with its list of files as JSON, or
the tar, on standard input (a lane has tens of thousands of files: too many for the command line).
"""

from __future__ import annotations

from ddtree_deploy.remote.bundle import Bundle, text

_CHECK = Bundle("overlay staging check", ("overlay_staging.py", "overlay_staging_check.py"))
_RECEIVE = Bundle("overlay staging receiver", ("overlay_staging.py", "overlay_durable.py",
                                               "overlay_tar_read.py",
                                               "overlay_staging_receive.py"))


def source_tar() -> str:
    """The source's tar writer (argv: site-packages; stdin: [[sha256, path], ...])."""
    return text("overlay_source_tar.py")


def staging_check() -> str:
    """The target's staging check (argv: the staging folder; stdin: [[sha256, size], ...])."""
    return _CHECK.source()


def staging_receive() -> str:
    """The target's staging receiver (argv: the staging folder; stdin: the tar)."""
    return _RECEIVE.source()


# The shell around a script: the first byte of stdout says whether the rest is
# zstd ("Z") or plain ("P"). $1: python, $2: script, $3: its argument, $4: zstd flags.
SOURCE_SHELL = (
    'if [ -n "$4" ] && command -v zstd >/dev/null 2>&1; then printf Z; '
    '"$1" -c "$2" "$3" | zstd -q -c -T0 $4; '
    'else printf P; exec "$1" -c "$2" "$3"; fi'
)

# $1: python, $2: script, $3: staging, $4: "z" when stdin is zstd.
RECEIVE_SHELL = (
    'if [ "$4" = z ]; then zstd -q -d -c --long=27 | "$1" -c "$2" "$3"; '
    'else exec "$1" -c "$2" "$3"; fi'
)
