"""The request-parameter contract (docs/request-parameters.md) against each release's real wheel.

Every field of the release's ``SamplingParams`` (its ``__init__`` parameters) and
``GenerateReqInput`` (its dataclass fields, ``BaseReq``'s included), read from the wheel's source,
must have a row in the contract naming that release, and a rule in the shared admission
(payload/ddtree/admission.py) that says the same. A release is one entry of RELEASES: the wheel
(tests/wheels.toml) and the files its classes live in.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload"))
from ddtree import admission  # noqa: E402
from wheelcache import wheel  # noqa: E402

DOC = ROOT / "docs" / "request-parameters.md"
# release -> (file of SamplingParams, file of GenerateReqInput and BaseReq), in the wheel
_FILES = ("sglang/srt/sampling/sampling_params.py", "sglang/srt/managers/io_struct.py")
RELEASES = {"0.5.11": _FILES, "0.5.17": _FILES, "0.5.19": _FILES, "0.5.21": _FILES,
            "0.5.23": _FILES}


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _fields(tree: ast.Module, name: str) -> list[str]:
    """A class's fields: its ``__init__`` parameters where it has one (SamplingParams up to
    0.5.1x), else its annotated class attributes (dataclasses, msgspec Structs), those of a base
    class defined in the same file first (BaseReq)."""
    cls = _class(tree, name)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None)
    if init is not None:
        return [a.arg for a in init.args.args + init.args.kwonlyargs if a.arg != "self"]
    local = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    out: list[str] = []
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in local:
            out += _fields(tree, base.id)
    annotated = [n.target.id for n in cls.body
                 if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                 and not (isinstance(n.annotation, ast.Subscript)
                          and getattr(n.annotation.value, "id", "") == "ClassVar")]
    return out + [f for f in annotated if f not in out]


def wheel_fields(release: str) -> dict[str, list[str]]:
    sampling_file, request_file = RELEASES[release]
    with zipfile.ZipFile(wheel("sglang", release)) as zf:
        sampling = ast.parse(zf.read(sampling_file).decode())
        request = ast.parse(zf.read(request_file).decode())
    return {"SamplingParams": _fields(sampling, "SamplingParams"),
            "GenerateReqInput": _fields(request, "GenerateReqInput")}


def doc_rows() -> dict[str, dict[str, tuple[set[str], str, str]]]:
    """table -> field -> (releases, DDTREE column, why column)."""
    tables: dict[str, dict[str, tuple[set[str], str, str]]] = {}
    current = ""
    for line in DOC.read_text().splitlines():
        heading = re.match(r"## `(\w+)`", line)
        if heading:
            current = heading.group(1)
            tables[current] = {}
            continue
        row = re.match(r"\| `(\w+)` \| ([^|]+) \| ([^|]+) \| (.*) \|$", line)
        if row and current:
            releases = {r.strip() for r in row.group(2).split(",")}
            tables[current][row.group(1)] = (releases, row.group(3).strip(), row.group(4).strip())
    return tables


KIND = {admission.SERVED: "served", admission.OFF: "refused when set"}


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_field_of_the_release_has_a_row_and_a_rule(release: str) -> None:
    rows = doc_rows()
    rules = {"SamplingParams": admission.SAMPLING_RULES,
             "GenerateReqInput": admission.REQUEST_RULES}
    for table, fields in wheel_fields(release).items():
        assert len(fields) > 20, f"{table}: too few fields read ({fields})"
        missing_row = [f for f in fields
                       if release not in rows[table].get(f, (set(), "", ""))[0]]
        assert not missing_row, f"{table} of {release}: no row in {DOC.name} for {missing_row}"
        missing_rule = [f for f in fields if f not in rules[table]]
        assert not missing_rule, f"{table} of {release}: no admission rule for {missing_rule}"
        for f in fields:
            rule, (_, said, why) = rules[table][f], rows[table][f]
            want = KIND.get(rule.kind, f"neutral only ({rule.neutral})")
            assert said == want, f"{table}.{f}: the contract says {said!r}, the rule {want!r}"
            assert why == rule.why, f"{table}.{f}: the contract's reason is not the rule's"


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


def _real_request_class(release: str) -> type:
    """The release's own ``GenerateReqInput`` (with ``BaseReq``), compiled from the wheel's
    source alone: its fields and defaults as the HTTP handlers build it."""
    _, request_file = RELEASES[release]
    with zipfile.ZipFile(wheel("sglang", release)) as zf:
        tree = ast.parse(zf.read(request_file).decode())
    body = [_class(tree, "BaseReq"), _class(tree, "GenerateReqInput")]
    import uuid
    from abc import ABC
    from collections import Counter
    from dataclasses import dataclass, field

    scope: dict[str, Any] = {"dataclass": dataclass, "field": field, "ABC": ABC, "uuid": uuid,
                             "Counter": Counter, "__name__": __name__}  # a module in sys.modules
    source = ast.Module(body=[ast.ImportFrom(module="__future__", names=[
        ast.alias(name="annotations")], level=0), *body], type_ignores=[])
    exec(compile(ast.fix_missing_locations(source), request_file, "exec"), scope)
    return scope["GenerateReqInput"]


@pytest.mark.parametrize("release", ["0.5.11"])  # the patch set's release (the plugin: its own)
def test_the_payloads_admission_serves_plain_requests_of_the_real_class(release: str) -> None:
    """ddtree_request.admit (the 0.5.11 glue) on the release's real dataclass: a request as
    /generate builds it, and as the OpenAI routes fill it, passes; a penalty or an unknown
    field's non-default value is refused; another algorithm's server is not checked."""
    glue = _glue()
    cls = _real_request_class(release)
    ddtree = types.SimpleNamespace(speculative_algorithm="DDTREE")
    glue.admit(ddtree, cls(input_ids=[1, 2, 3], sampling_params={"temperature": 0.7, "top_k": 2}))
    glue.admit(ddtree, cls(text="hi", stream=True, return_logprob=False, top_logprobs_num=0,
                           logprob_start_len=-1, modalities=[], image_data=None, rid="r1",
                           sampling_params={"max_new_tokens": 4, "frequency_penalty": 0.0,
                                            "presence_penalty": 0.0, "min_new_tokens": 0,
                                            "repetition_penalty": 1.0, "logit_bias": None,
                                            "custom_params": None, "json_schema": None}))
    with pytest.raises(ValueError, match="DDTREE speculative decoding refuses frequency_pen"):
        glue.admit(ddtree, cls(input_ids=[1], sampling_params={"frequency_penalty": 1.5}))
    glue.admit(types.SimpleNamespace(speculative_algorithm="DFLASH"),
               cls(input_ids=[1], sampling_params={"frequency_penalty": 1.5}))
    later = dataclasses.make_dataclass("GenerateReqInput", [("new_knob", int, 0)], bases=(cls,))
    glue.admit(ddtree, later(input_ids=[1]))
    with pytest.raises(ValueError, match="refuses new_knob=3: a field DDTREE does not know"):
        glue.admit(ddtree, later(input_ids=[1], new_knob=3))


def _glue() -> Any:
    """payload/sglang-0.5.11/srt/speculative/ddtree_request.py with its one sglang import
    (the shared rules) resolved to payload/ddtree/admission.py."""
    path = ROOT / "payload" / "sglang-0.5.11" / "srt" / "speculative" / "ddtree_request.py"
    text = path.read_text().replace("from sglang.srt.speculative.ddtree_admission import",
                                    "from ddtree.admission import")
    module = types.ModuleType("ddtree_request")
    exec(compile(text, str(path), "exec"), module.__dict__)
    return module


def test_every_release_the_payload_serves_has_its_fields_read() -> None:
    """RELEASES covers the patch set's releases (payload.yaml) and the plugin's (releases.py)."""
    from ddtree_deploy.rules.matrix import shipped_matrix

    matrix = shipped_matrix()
    served = set(matrix.patch) | set(matrix.plugin)
    assert served and served == set(RELEASES), sorted(served ^ set(RELEASES))
