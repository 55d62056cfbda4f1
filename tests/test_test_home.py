"""The tests' HOME and XDG folders are the checkout's own (.test-home/, set by conftest.py before
the tool is imported): the tool's default caches, state and config, and every cache a child
process keeps under HOME, land inside the repository, never under the real HOME."""

from __future__ import annotations

import os
from pathlib import Path

from ddtree_deploy import xdg
from ddtree_deploy.config.schema import HostSpec

REPO = Path(__file__).resolve().parent.parent
HOME = REPO / ".test-home"


def test_home_and_xdg_folders_are_inside_the_checkout() -> None:
    assert Path.home() == HOME and Path(os.path.expanduser("~")) == HOME
    for var, sub in (("XDG_CACHE_HOME", ".cache"), ("XDG_CONFIG_HOME", ".config"),
                     ("XDG_STATE_HOME", ".local/state"), ("XDG_DATA_HOME", ".local/share")):
        assert os.environ[var] == str(HOME / sub)
    for folder in (xdg.cache_dir(), xdg.state_dir(), xdg.config_dir()):
        assert folder.is_relative_to(HOME) and folder.name == "ddtree-deploy"
    # what the tool derives from HOME at a host's validation: the default known_hosts
    spec = HostSpec.model_validate({"name": "h", "address": "h"})
    assert spec.known_hosts == HOME / ".ssh" / "known_hosts"


def test_the_folder_is_ignored_by_git() -> None:
    ignored = (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "/.test-home/" in ignored
