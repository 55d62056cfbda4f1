"""Build hook: the wheel carries the commit it was built from (ddtree_deploy/_data/COMMIT),
read by `ddtree-deploy --version` when no git checkout is at hand (ddtree_deploy/version.py)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CommitHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        try:
            done = subprocess.run(["git", "-C", self.root, "rev-parse", "--short=12", "HEAD"],
                                  capture_output=True, text=True, timeout=30, check=False)
            head = done.stdout.strip() if done.returncode == 0 else ""
        except OSError:
            head = ""
        self._folder = tempfile.mkdtemp(prefix="ddtree-commit-")
        out = Path(self._folder) / "COMMIT"
        out.write_text((head or "unknown") + "\n", encoding="utf-8")
        build_data["force_include"][str(out)] = "ddtree_deploy/_data/COMMIT"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        folder = getattr(self, "_folder", None)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
