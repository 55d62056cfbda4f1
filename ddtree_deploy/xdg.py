"""XDG folders of the tool (config, state, cache), honouring the XDG variables."""

from __future__ import annotations

import os
from pathlib import Path

APP = "ddtree-deploy"


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var)
    base = Path(value) if value and os.path.isabs(value) else Path.home() / default
    return base / APP


def config_dir() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config")


def state_dir() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state")


def cache_dir() -> Path:
    return _xdg("XDG_CACHE_HOME", ".cache")
