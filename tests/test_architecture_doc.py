"""docs/architecture.md lists every module of the tool and of the lab, and only modules that
exist: a module added, moved or removed without its line there fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = (ROOT / "ddtree_deploy", ROOT / "lab" / "ddtree_lab")


def _listed() -> set[str]:
    """Paths named in the Modules section: a folder line `` `dir/` `` then `` - `name.py` ``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    out: set[str] = set()
    folder = None
    for line in section.splitlines():
        if m := re.fullmatch(r"`([\w./]+)/`", line.strip()):
            folder = m.group(1)
        elif (m := re.match(r"- `([\w.]+\.py)` — \S", line)) and folder is not None:
            out.add(f"{folder}/{m.group(1)}")
    return out


def _modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in pkg.rglob("*.py")
            if "__pycache__" not in p.parts}


def test_every_module_has_its_line_and_every_line_a_module() -> None:
    listed, modules = _listed(), _modules()
    assert len(modules) > 100  # the walk found the packages
    assert sorted(modules - listed) == [], "modules missing from docs/architecture.md"
    assert sorted(listed - modules) == [], "docs/architecture.md names modules that are gone"
