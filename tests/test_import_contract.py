"""The import contract: the layers of the tool, read from the source with ast (no import runs).

Data flows facts -> rules -> plan -> apply, over the transport: a module may import its own layer
and the layers listed for it in MAY_IMPORT, nothing above. The transport imports only errors;
facts import no rules, plan, apply or CLI; rules no plan, apply or CLI; only the CLI imports typer
and rich; only the transport imports paramiko and fabric; nothing in the tool imports the lab
(ddtree_lab, a distribution of its own that depends on the tool).

Moving modules needs only a table edit: LAYERS names modules by patterns, and a module belongs to
the layer of its longest matching pattern. For example, when connect.py and fanout.py move into
transport/, add "ddtree_deploy.transport.connect" and "ddtree_deploy.transport.fanout" to the
"connect" layer; cli*.py moving into cli/ and config*.py into config/ match their patterns as
they stand. A new module that matches no pattern fails the test until it is given a layer.

KNOWN lists the imports that break the layering today, each with the reason: they are reported
here, not allowed silently. An entry that no longer matches any import fails the test, so it is
removed when the import is fixed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = "ddtree_deploy"
LAB = "ddtree_lab"

# Patterns: "a.b" is module a.b and every module below it; "a.b*" is every module whose dotted
# name starts with "a.b" (a.b, a.b_x, a.b.y); "=a" is module a alone.
LAYERS: dict[str, tuple[str, ...]] = {
    "errors": ("ddtree_deploy.errors",),
    "base": ("=ddtree_deploy", "ddtree_deploy.xdg", "ddtree_deploy.resources",
             "ddtree_deploy.localproc", "ddtree_deploy.atomicfile", "ddtree_deploy.version",
             "ddtree_deploy.isotime"),
    "transport": ("ddtree_deploy.transport",),
    # how a server is started: one model below config, service, rules and bench
    "settings": ("ddtree_deploy.settings",),
    "config": ("ddtree_deploy.config*",),
    "connect": ("ddtree_deploy.transport.connect", "ddtree_deploy.transport.fanout",
                "ddtree_deploy.hostcheck"),
    "remote": ("ddtree_deploy.remote",),  # what runs on hosts, and the runner that sends it
    "facts": ("ddtree_deploy.facts",),
    "rules": ("ddtree_deploy.rules",),
    # the operations plan steps carry out (and the CLI calls directly)
    "operations": ("ddtree_deploy.service", "ddtree_deploy.health", "ddtree_deploy.payload",
                   "ddtree_deploy.overlay"),
    "converge": ("ddtree_deploy.converge",),  # plan and apply
    "bench": ("ddtree_deploy.bench",),
    "cli": ("ddtree_deploy.cli*",),
}

_BELOW_FACTS = ("errors", "base", "settings", "config", "connect", "transport", "remote")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "errors": (),
    "base": ("errors",),
    "transport": ("errors",),
    "settings": ("errors",),
    "config": ("errors", "base", "settings"),
    "connect": ("errors", "base", "config", "transport"),
    "remote": ("errors", "base", "transport"),
    "facts": _BELOW_FACTS,
    "rules": ("errors", "base", "settings", "config", "facts"),
    "operations": (*_BELOW_FACTS, "facts", "rules"),
    "converge": (*_BELOW_FACTS, "facts", "rules", "operations"),
    "bench": (*_BELOW_FACTS, "facts", "rules", "operations"),
    "cli": tuple(LAYERS),
}

# Libraries only some layers may import (any other layer importing them breaks the contract).
LIBRARIES: dict[str, tuple[str, ...]] = {
    "typer": ("cli",),
    "rich": ("cli",),
    "paramiko": ("transport",),
    "fabric": ("transport",),
    "invoke": ("transport",),
}

# Imports that break the layering today: (importer pattern, imported pattern or library, why).
KNOWN: tuple[tuple[str, str, str], ...] = (
    ("ddtree_deploy.overlay.progress", "rich",
     "the overlay draws its own progress bars; rendering belongs to the CLI (a progress sink "
     "the CLI passes in)"),
    ("ddtree_deploy.overlay.progress", "ddtree_deploy.cli*", "as above: cli.text.plain"),
    ("ddtree_deploy.overlay.render", "rich", "the overlay's tables are drawn in overlay/"),
    ("ddtree_deploy.overlay.render", "ddtree_deploy.cli*", "as above: cli.text.plain"),
)


def _match(pattern: str, module: str) -> int:
    """How specific ``pattern``'s match of ``module`` is (its length), 0 when it does not match."""
    if pattern.startswith("="):
        return len(pattern) if module == pattern[1:] else 0
    if pattern.endswith("*"):
        return len(pattern) if module.startswith(pattern[:-1]) else 0
    return len(pattern) if module == pattern or module.startswith(pattern + ".") else 0


def layer_of(module: str) -> str | None:
    best = max(((_match(p, module), layer) for layer, pats in LAYERS.items() for p in pats),
               default=(0, None))
    return best[1] if best[0] else None


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str  # a module of the tool or the lab, or a library's top-level name
    line: int

    def where(self) -> str:
        return f"{self.importer.replace('.', '/')}.py:{self.line}: imports {self.imported}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def tool_modules() -> dict[str, Path]:
    files = sorted((ROOT / TOOL).rglob("*.py"))
    return {_module_name(f): f for f in files if "__pycache__" not in f.parts}


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The module ``name`` denotes: itself, else its longest prefix that is a module (an import
    of a class or function names its module)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return name


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """Every name imported anywhere in the file (in functions and TYPE_CHECKING blocks too),
    with importlib.import_module("...") calls of a constant name."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            found.append((source, node.lineno))
            found += [(f"{source}.{a.name}", node.lineno) for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.args[0].value, node.lineno))
    return found


@cache
def edges() -> tuple[Edge, ...]:
    modules = tool_modules()
    out: set[Edge] = set()
    for module, path in modules.items():
        for name, line in _imports(module, path):
            top = name.split(".")[0]
            if top == TOOL:
                target = _resolve(name, modules)
                if target != module:
                    out.add(Edge(module, target, line))
            elif top == LAB:
                out.add(Edge(module, name, line))
            elif top in LIBRARIES:
                out.add(Edge(module, top, line))
    # "from a import b" gives both a and a.b: keep the module it resolves to, once per line
    return tuple(sorted(out, key=lambda e: (e.importer, e.line, e.imported)))


def _known(edge: Edge) -> bool:
    return any(_match(a, edge.importer) and (_match(b, edge.imported) or b == edge.imported)
               for a, b, _ in KNOWN)


def test_the_table_is_consistent() -> None:
    assert set(MAY_IMPORT) == set(LAYERS)
    for layer, allowed in MAY_IMPORT.items():
        assert set(allowed) <= set(LAYERS), layer
    for lib, layers in LIBRARIES.items():
        assert set(layers) <= set(LAYERS), lib


def test_every_module_has_a_layer() -> None:
    lost = [m for m in tool_modules() if layer_of(m) is None]
    assert lost == [], f"modules in no layer (add a pattern to LAYERS): {lost}"


def test_the_analysis_sees_real_imports() -> None:
    """Negative control: the reader finds imports where they are known to be."""
    found = {(e.importer, e.imported) for e in edges()}
    assert ("ddtree_deploy.transport.ssh", "paramiko") in found
    assert ("ddtree_deploy.cli.app", "typer") in found
    assert ("ddtree_deploy.facts.gather", "ddtree_deploy.transport.connect") in found
    assert layer_of("ddtree_deploy.cli.common") == layer_of("ddtree_deploy.cli.app") == "cli"
    assert layer_of("ddtree_deploy.config.schema") == "config"
    assert layer_of("ddtree_deploy.config.hosts") == "config"
    assert layer_of("ddtree_deploy") == "base" and layer_of("ddtree_deploy.nothing") is None


def _breaks(edge: Edge) -> str | None:
    """Why ``edge`` breaks the contract, or None."""
    mine = layer_of(edge.importer)
    assert mine is not None
    if edge.imported.split(".")[0] == LAB:
        return "the tool imports the lab"
    if edge.imported in LIBRARIES:
        if mine not in LIBRARIES[edge.imported]:
            return f"{edge.imported} belongs to {'/'.join(LIBRARIES[edge.imported])} only"
        return None
    theirs = layer_of(edge.imported)
    if theirs is None:
        return "it imports a module in no layer"
    if theirs != mine and theirs not in MAY_IMPORT[mine]:
        return f"{mine} may not import {theirs}"
    return None


def test_imports_keep_the_layers() -> None:
    broken = [f"{e.where()} ({why})" for e in edges() if (why := _breaks(e)) and not _known(e)]
    assert broken == [], "imports across the layers:\n" + "\n".join(broken)


def test_known_breaks_are_still_there() -> None:
    """Each KNOWN entry still matches an import that breaks the contract (else remove it)."""
    stale = [entry for entry in KNOWN
             if not any(_match(entry[0], e.importer)
                        and (_match(entry[1], e.imported) or entry[1] == e.imported)
                        and _breaks(e) for e in edges())]
    assert stale == []


def test_no_tool_module_names_the_lab() -> None:
    """Not even as a string (an importlib name, an entry point value)."""
    naming = [m for m, path in tool_modules().items() if LAB in path.read_text()]
    assert naming == []


def test_the_lab_lives_beside_the_tool() -> None:
    assert not (ROOT / TOOL / "lab").exists()
    assert (ROOT / "lab" / LAB / "__init__.py").is_file()
