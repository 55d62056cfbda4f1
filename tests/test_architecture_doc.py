"""docs/architecture.md stays true to the tree: every path it names exists (a file or folder
moved or removed without the page fails here); docs/modules.md, generated from the modules'
docstrings (scripts/gen_docs.py), lists every module of the tool and of the lab, and only
modules that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
MODULES = ROOT / "docs" / "modules.md"
PACKAGES = (ROOT / "ddtree_deploy", ROOT / "lab" / "ddtree_lab")
# A backquoted word is a path when it has a folder or a file's extension in it.
PATHLIKE = re.compile(r"[\w.*<>/-]*(/|\.(py|md|yaml|json|toml|tsv|sh|j2|txt))[\w.*<>/-]*")
# Paths inside the package are written without ddtree_deploy/ (the page says so).
BASES = (ROOT, ROOT / "ddtree_deploy")


def _listed() -> set[str]:
    """Paths named in docs/modules.md: a folder line `` `dir/` `` then `` - `name.py` ``."""
    out: set[str] = set()
    folder = None
    for line in MODULES.read_text(encoding="utf-8").splitlines():
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
    assert sorted(modules - listed) == [], "modules missing from docs/modules.md (gen_docs.py)"
    assert sorted(listed - modules) == [], "docs/modules.md names modules that are gone"


def _named_paths(text: str) -> list[str]:
    code = re.sub(r"```.*?```", "", text, flags=re.S)  # the flow's drawing is no path
    words = re.findall(r"`([^`\s]+)`", code)
    return [w for w in words if PATHLIKE.fullmatch(w) and not w.startswith(("-", "http"))]


def _exists(word: str) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", word.rstrip("/"))  # `steps/<kind>.py`: some kind
    for base in BASES:
        if "*" in pattern:
            if any(base.glob(pattern)):
                return True
        elif (base / pattern).exists():
            return True
    return False


def test_every_path_the_architecture_page_names_exists() -> None:
    named = _named_paths(DOC.read_text(encoding="utf-8"))
    assert len(named) > 60 and "converge/steps/" in named and "remote/bundle.py" in named
    assert [w for w in named if not _exists(w)] == []


def test_the_path_check_fails_for_a_path_that_is_gone() -> None:
    named = _named_paths("`rules/checks.py` then `rules/gone.py`, `tests/data/steps/<kind>/*.json`,"
                         " `--json`, `X-DDTreeDeploy-Managed=yes`, `docs/nowhere/`")
    assert named == ["rules/checks.py", "rules/gone.py", "tests/data/steps/<kind>/*.json",
                     "docs/nowhere/"]
    assert [w for w in named if not _exists(w)] == ["rules/gone.py", "docs/nowhere/"]


def test_the_architecture_page_is_an_overview_a_newcomer_reads() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert len(text) < 20_000, len(text)
    for heading in ("## The flow: facts → rules → plan → apply", "## The packages",
                    "## The payload: two forms", "## The lab", "## The GPU rehearsal",
                    "## Where a new thing goes"):
        assert heading in text, heading
    assert "(modules.md)" in text
