"""Behaviour kept: every golden file of tests/golden.py regenerated and compared byte for byte.

The golden files were captured at commit 4a67c69, before issue 26 (one model of a server's
settings) changed how a server's settings are merged, validated and rendered. A change that
alters help, a plan or a unit ON PURPOSE updates them with one command and commits the diff:

    .venv/bin/python tests/golden.py --update
"""

from __future__ import annotations

import difflib

import golden
import pytest

FILES = golden.generate()


def test_no_golden_file_is_missing_or_left_over() -> None:
    on_disk = {str(p.relative_to(golden.GOLDEN)) for p in golden.GOLDEN.rglob("*") if p.is_file()}
    assert sorted(set(FILES) - on_disk) == [], "new outputs: run tests/golden.py --update"
    assert sorted(on_disk - set(FILES)) == [], "outputs gone: run tests/golden.py --update"


@pytest.mark.parametrize("rel", sorted(FILES))
def test_output_is_as_captured(rel: str) -> None:
    path = golden.GOLDEN / rel
    if not path.is_file():
        pytest.fail(f"{rel}: no golden file (run tests/golden.py --update)")
    want = path.read_text(encoding="utf-8")
    got = FILES[rel]
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"golden/{rel}", "now"))
        pytest.fail(f"{rel} differs from its golden file (on purpose? run "
                    f".venv/bin/python tests/golden.py --update):\n{diff}")
