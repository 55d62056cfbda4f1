"""The lab's light ``sglang`` package init (run in place of the real ``__init__.py``).

The real init imports numpy, torch and the frontend language; the lab's stand-in
torch cannot carry that. This init only sets what tools read from the package:
``__version__`` (from the installed sglang dist-info, as sglang/version.py falls
back to) and a marker; ``__path__`` is the real sglang folder (set by the hook),
so ``sglang.srt.*``, ``sglang.version`` and the rest load from the real files.
"""

from __future__ import annotations

import importlib.metadata
from types import ModuleType

from ddtree_lab_standin.hook import MARKER

STANDIN_NOTE = (
    "sglang package init served by ddtree-lab-standin (lab only); "
    "submodules are the real installed files"
)


def installed_version() -> str:
    """Version of the installed sglang distribution, read from its dist-info."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def populate(module: ModuleType) -> None:
    """Fill the ``sglang`` module namespace."""
    module.__dict__["__version__"] = installed_version()
    module.__doc__ = STANDIN_NOTE
    module.__dict__[MARKER] = True
