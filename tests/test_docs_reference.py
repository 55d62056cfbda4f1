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


def test_every_crash_signature_is_in_troubleshooting() -> None:
    from ddtree_deploy.health.signatures import SIGNATURES

    text = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    for sig in SIGNATURES:
        assert f"## `{sig.id}`" in text and f"`{sig.pattern}`" in text, sig.id


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
