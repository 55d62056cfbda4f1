"""The guard both staging scripts run first (bundled with each by remote/bundle.py).

A staging folder is <venv>/.ddtree-deploy/overlay/staging/<plan id> and must stay inside its
venv once symlinks are resolved (no link out); anything else is refused with exit 2.
Python >= 3.8 syntax, stdlib only.
"""

from __future__ import annotations

import os
import sys


def inside_venv(staging: str) -> bool:
    parts = os.path.normpath(staging).split(os.sep)
    if len(parts) < 6 or parts[-4:-1] != [".ddtree-deploy", "overlay", "staging"]:
        return False
    venv = os.sep.join(parts[:-4]) or os.sep
    return os.path.realpath(staging) == os.path.join(os.path.realpath(venv), *parts[-4:])


def guard(staging: str) -> None:
    if not inside_venv(staging):
        sys.stderr.write(f"refusing: {staging} is not a staging folder inside its venv\n")
        sys.exit(2)
