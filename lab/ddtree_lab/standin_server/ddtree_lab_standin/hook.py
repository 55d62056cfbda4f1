"""Meta-path finder that serves the lab's ``sglang`` init and ``sglang.launch_server``.

Registered at interpreter start by ``ddtree_lab_standin.pth``. It acts only when
the real sglang distribution is installed in the running environment:

- ``import sglang`` runs :func:`ddtree_lab_standin.sglang_init.populate` instead of
  the real ``sglang/__init__.py`` (which imports numpy, torch and more), with
  ``__path__`` set to the real sglang folder, so ``sglang.srt.*`` still loads from
  the real files (``sglang/srt`` is a namespace package in 0.5.10 and 0.5.11);
- ``sglang.launch_server`` is served from :mod:`ddtree_lab_standin.launch_server`.

With no real sglang installed the finder returns ``None`` and ``import sglang``
fails the normal way (ModuleNotFoundError). No real file or RECORD is changed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).resolve().parent
MARKER = "__ddtree_lab_standin__"


class _SglangInitLoader(importlib.abc.Loader):
    """Loader for the top-level ``sglang`` package: our init, the real folder."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # default module creation

    def exec_module(self, module: ModuleType) -> None:
        from ddtree_lab_standin import sglang_init

        sglang_init.populate(module)


class StandinFinder(importlib.abc.MetaPathFinder):
    """Finds ``sglang`` (our init, real path) and ``sglang.launch_server`` (ours)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "sglang":
            return self._sglang_spec()
        if fullname == "sglang.launch_server":
            parent = sys.modules.get("sglang")
            if parent is None or not getattr(parent, MARKER, False):
                return None
            source = str(_HERE / "launch_server.py")
            loader = importlib.machinery.SourceFileLoader(fullname, source)
            return importlib.machinery.ModuleSpec(fullname, loader, origin=source)
        return None

    @staticmethod
    def _sglang_spec() -> importlib.machinery.ModuleSpec | None:
        real = importlib.machinery.PathFinder.find_spec("sglang")
        if real is None or real.origin is None or real.submodule_search_locations is None:
            return None  # not installed (or only a namespace folder): fail normally
        spec = importlib.machinery.ModuleSpec(
            "sglang", _SglangInitLoader(), origin=real.origin, is_package=True
        )
        spec.submodule_search_locations = list(real.submodule_search_locations)
        spec.has_location = True
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent; never raises)."""
    try:
        if not any(isinstance(f, StandinFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, StandinFinder())
    except Exception as exc:  # a broken hook must not break interpreter start
        print(f"ddtree-lab-standin: hook not installed: {exc}", file=sys.stderr)
