"""The request-parameter contract (docs/request-parameters.md) against each release's real wheel.

Every field of the release's ``SamplingParams`` (its ``__init__`` parameters) and
``GenerateReqInput`` (its dataclass fields, ``BaseReq``'s included), read from the wheel's source,
must have a row in the contract naming that release, and a rule in the shared admission
(payload/ddtree/admission.py) that says the same. A release is one entry of RELEASES: the wheel
(tests/wheels.toml) and the files its classes live in.
"""

from __future__ import annotations

import ast
import re
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload"))
from ddtree import admission  # noqa: E402
from wheelcache import wheel  # noqa: E402

DOC = ROOT / "docs" / "request-parameters.md"
# release -> (file of SamplingParams, file of GenerateReqInput and BaseReq), in the wheel
RELEASES = {
    "0.5.11": ("sglang/srt/sampling/sampling_params.py", "sglang/srt/managers/io_struct.py"),
}


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def wheel_fields(release: str) -> dict[str, list[str]]:
    sampling_file, request_file = RELEASES[release]
    with zipfile.ZipFile(wheel("sglang", release)) as zf:
        sampling = ast.parse(zf.read(sampling_file).decode())
        request = ast.parse(zf.read(request_file).decode())
    init = next(n for n in _class(sampling, "SamplingParams").body
                if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    params = [a.arg for a in init.args.args + init.args.kwonlyargs if a.arg != "self"]
    fields: list[str] = []
    for cls in ("BaseReq", "GenerateReqInput"):
        fields += [n.target.id for n in _class(request, cls).body
                   if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return {"SamplingParams": params, "GenerateReqInput": fields}


def doc_rows() -> dict[str, dict[str, tuple[set[str], str]]]:
    """table -> field -> (releases, DDTREE column)."""
    tables: dict[str, dict[str, tuple[set[str], str]]] = {}
    current = ""
    for line in DOC.read_text().splitlines():
        heading = re.match(r"## `(\w+)`", line)
        if heading:
            current = heading.group(1)
            tables[current] = {}
            continue
        row = re.match(r"\| `(\w+)` \| ([^|]+) \| ([^|]+) \|", line)
        if row and current:
            releases = {r.strip() for r in row.group(2).split(",")}
            tables[current][row.group(1)] = (releases, row.group(3).strip())
    return tables


KIND = {admission.SERVED: "served", admission.OFF: "refused when set"}


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_field_of_the_release_has_a_row_and_a_rule(release: str) -> None:
    rows = doc_rows()
    rules = {"SamplingParams": admission.SAMPLING_RULES,
             "GenerateReqInput": admission.REQUEST_RULES}
    for table, fields in wheel_fields(release).items():
        assert len(fields) > 20, f"{table}: too few fields read ({fields})"
        missing_row = [f for f in fields if release not in rows[table].get(f, (set(), ""))[0]]
        assert not missing_row, f"{table} of {release}: no row in {DOC.name} for {missing_row}"
        missing_rule = [f for f in fields if f not in rules[table]]
        assert not missing_rule, f"{table} of {release}: no admission rule for {missing_rule}"
        for f in fields:
            rule, said = rules[table][f], rows[table][f][1]
            want = KIND.get(rule.kind, f"neutral only ({rule.neutral})")
            assert said == want, f"{table}.{f}: the contract says {said!r}, the rule {want!r}"


def test_a_field_without_a_row_fails_the_check(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """The check can fail: the contract without its temperature row."""
    cut = tmp_path / "request-parameters.md"
    cut.write_text("\n".join(line for line in DOC.read_text().splitlines()
                             if not line.startswith("| `temperature` |")))
    monkeypatch.setattr(sys.modules[__name__], "DOC", cut)
    with pytest.raises(AssertionError, match=r"no row in request-parameters.md for \['temperature"):
        test_every_field_of_the_release_has_a_row_and_a_rule("0.5.11")


def test_the_readme_links_the_contract() -> None:
    assert "(docs/request-parameters.md)" in (ROOT / "README.md").read_text()
