"""The reference pages under docs/ are generated from the code and stay true to it (issue 31):
docs/hosts-yaml.md lists every field of the schema's models, docs/commands.md every built-in
command and parameter; a change to either without `scripts/gen_docs.py` fails here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_docs", module)
    spec.loader.exec_module(module)
    return module


def test_the_reference_pages_are_what_the_code_generates() -> None:
    gen = _gen()
    for path, make in gen.PAGES.items():
        assert path.read_text(encoding="utf-8") == make(), \
            f"{path.relative_to(ROOT)} is out of date: run .venv/bin/python scripts/gen_docs.py"


def test_every_schema_field_is_in_the_hosts_yaml_reference() -> None:
    from ddtree_deploy.config.schema import Deployment, HostSpec, SglangSpec, VenvSpec

    text = (ROOT / "docs" / "hosts-yaml.md").read_text(encoding="utf-8")
    for model in (HostSpec, VenvSpec, Deployment, SglangSpec):
        for name in model.model_fields:
            if name != "name":
                assert f"| `{name}` |" in text, (model.__name__, name)


def _troubleshooting() -> ModuleType:
    _gen()  # puts scripts/ on the path
    import gen_troubleshooting

    return gen_troubleshooting


def _page() -> str:
    return (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")


def test_every_crash_signature_is_in_troubleshooting() -> None:
    from ddtree_deploy.health.signatures import SIGNATURES

    text = _page()
    for sig in SIGNATURES:
        assert f'<a id="{sig.id}"></a>\n### `{sig.id}`' in text and f"`{sig.pattern}`" in text, \
            sig.id
    for pid, _, _ in _troubleshooting().probe_diagnoses():
        assert f'<a id="{pid}"></a>' in text, pid


def test_every_doctor_finding_id_has_an_entry() -> None:
    """A rule with a new finding id fails here until troubleshooting_text.DOCTOR explains it
    (and an entry whose id no rule makes any more fails too)."""
    gen = _troubleshooting()
    from troubleshooting_text import DOCTOR

    ids = [check.id for check in gen.doctor_checks()]
    assert len(ids) >= 35 and "venv.lane-mix" in ids and "deploy.sglang-missing" in ids
    assert "model.*-config-missing" in ids  # an f-string id, its varying part as *
    assert sorted(set(ids) - DOCTOR.keys()) == [], "no entry in scripts/troubleshooting_text.py"
    assert sorted(DOCTOR.keys() - set(ids)) == [], "an entry for an id no rule makes"
    text = _page()
    for fid in ids:
        assert f'<a id="{fid}"></a>\n### `{fid}`' in text, fid


def test_findings_are_made_only_where_the_page_reads_them() -> None:
    """doctor_checks() reads ddtree_deploy/rules/: a Finding made elsewhere would be missed."""
    import ast

    elsewhere = []
    for path in (ROOT / "ddtree_deploy").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" \
                    and path.parent.name != "rules":
                elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert elsewhere == []


def _literals() -> list[str]:
    """Every string literal of the tool's source, f-strings' fixed parts one by one."""
    import ast

    out: list[str] = []
    for path in (ROOT / "ddtree_deploy").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
    return out


def test_every_error_text_of_troubleshooting_is_the_tools() -> None:
    _gen()
    from troubleshooting_text import ERRORS

    literals = _literals()
    text = _page()
    assert len(ERRORS) >= 12
    for message, code, _, _ in ERRORS:
        assert any(message in literal for literal in literals), f"no longer in the code: {message}"
        assert f"### `{message}` (exit {code})" in text
    assert "2 > 1 > 3 > 4 > 0" in text and "| head" in text


def test_every_command_is_in_the_command_reference() -> None:
    from ddtree_deploy.cli import app as cli_app

    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    for name in cli_app.BUILT_INS:
        assert f"## `ddtree-deploy {name}`" in text, name
    assert "2 > 1 > 3 > 4 > 0" in text


def test_the_readme_is_a_quick_start_with_the_set_up_commands_first() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text) <= 15_000, len(text)
    blocks = [b.split("```", 1)[0].strip() for b in text.split("```sh\n")[1:]]
    assert blocks[:2] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for page in ("docs/usage.md", "docs/commands.md", "docs/hosts-yaml.md",
                 "docs/troubleshooting.md", "CHANGELOG.md"):
        assert f"({page})" in text and (ROOT / page).exists(), page


def test_relative_links_of_the_docs_resolve() -> None:
    import re

    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_every_command_troubleshooting_gives_parses() -> None:
    """Each `ddtree-deploy ...` in a fix is a command line the CLI accepts as it stands (the
    real parser, as tests/test_remedies.py uses it; HOST, NAME and the like stay words)."""
    import re

    from test_remedies import parse

    commands = re.findall(r"`(ddtree-deploy [^`]*)`", _page())
    assert len(commands) > 40
    for command in sorted(set(commands)):
        filled = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), command)
        parse(filled.replace(" ...", ""))
