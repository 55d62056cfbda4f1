"""Run local system commands for the lab (root-only helpers), mapped to LabError."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from ddtree_lab.errors import LabError


def sh(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = 600,
    input_bytes: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, timeout=timeout, input=input_bytes, check=False
        )
    except FileNotFoundError as exc:
        raise LabError(
            f"'{argv[0]}' is not installed", hint="run scripts/setup.sh (installs the lab's tools)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"'{' '.join(argv)}' did not finish within {timeout:.0f}s") from exc
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()[-2000:]
        raise LabError(f"'{' '.join(argv)}' failed with exit code {proc.returncode}: {err}")
    return proc
