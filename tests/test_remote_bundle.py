"""remote/: every host-side script is Python 3.8, stdlib only, and bundles into one file.

The workstation-side modules of the package (bundle.py, runner.py, the transfer's shell in
overlay_transfer.py) are the only ones allowed other imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.payload import state as payload_state
from ddtree_deploy.remote import bundle, overlay_transfer

REMOTE = Path(bundle.__file__).resolve().parent
WORKSTATION = {"__init__.py", "bundle.py", "runner.py", "overlay_transfer.py"}
SCRIPTS = sorted(p.name for p in REMOTE.glob("*.py") if p.name not in WORKSTATION)


def _imports(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module or "")
    return found


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_is_python_38_and_stdlib_only(name: str) -> None:
    tree = ast.parse((REMOTE / name).read_text(encoding="utf-8"), feature_version=(3, 8))
    outside = {m for m in _imports(tree) if m.split(".")[0] not in sys.stdlib_module_names
               and m != "__future__" and not m.startswith("ddtree_deploy.remote.")}
    assert not outside, f"{name} imports {outside}"


BUNDLES = {"facts": bundle.FACTS.source, "overlay apply": bundle.OVERLAY_APPLY.source,
           "payload tool": payload_state.SCRIPT.source,
           "staging check": overlay_transfer.staging_check,
           "staging receive": overlay_transfer.staging_receive}


@pytest.mark.parametrize("which", sorted(BUNDLES))
def test_a_bundle_is_one_file_with_one_main(which: str) -> None:
    source = BUNDLES[which]()
    tree = ast.parse(source, feature_version=(3, 8))
    assert "ddtree_deploy" not in source.replace("ddtree-deploy", "")
    assert source.count("from __future__") == 1
    guards = [n for n in tree.body if isinstance(n, ast.If) and "__name__" in ast.unparse(n.test)]
    assert len(guards) == 1 and ast.unparse(guards[0]).endswith("sys.exit(main(sys.argv[1:]))")
    assert "typing" not in {m.split(".")[0] for m in _imports(tree)}  # annotations only


def test_a_bundle_runs_as_sent(tmp_path: Path) -> None:
    staging = tmp_path / "v" / ".ddtree-deploy" / "overlay" / "staging" / "p1"
    staging.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", overlay_transfer.staging_check(),
                           str(staging)], input=b"[]", capture_output=True, timeout=60,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert b'"present": []' in proc.stdout
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    proc = subprocess.run([sys.executable, "-c", overlay_transfer.staging_check(), str(outside)],
                          input=b"[]", capture_output=True, timeout=60, check=False)
    assert proc.returncode == 2 and b"not a staging folder inside its venv" in proc.stderr


def test_build_cuts_internal_imports_and_ends_with_one_main(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from __future__ import annotations\nX = 1\n")
    (tmp_path / "b.py").write_text(
        "import sys\n\nfrom ddtree_deploy.remote.a import X\n\n"
        "def main(argv):\n    print(X)\n    return 0\n"
        'if __name__ == "__main__":\n    main([])\n')
    b = bundle.Bundle("test", ("a.py", "b.py"))
    texts = [(tmp_path / p).read_text() for p in b.parts]
    one = bundle.build(b.title, b.parts, texts)
    assert "import X" not in one and one.count('if __name__ == "__main__":') == 1
    proc = subprocess.run([sys.executable, "-c", one], capture_output=True, timeout=60,
                          check=True)  # fmt: skip
    assert proc.stdout == b"1\n"
