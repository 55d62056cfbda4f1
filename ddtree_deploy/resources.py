"""Where the tool's data folders live: inside the installed wheel, or the checkout.

A wheel carries templates/, overlays/, payload/ and hosts.yaml under
ddtree_deploy/_data (see pyproject's force-include); a checkout or an editable
install has them at the repository root, one level above the package.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_path(name: str) -> Path:
    """Path of a data folder or file ('templates', 'overlays', 'payload', 'hosts.yaml')."""
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"ddtree-deploy data '{name}' is missing from this installation")


def embedded_hosts_file() -> Path:
    return data_path("hosts.yaml")
