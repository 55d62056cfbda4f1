"""Cached facts answer only for what they were gathered for.

The issue's case: hosts.yaml changed which venvs a host declares, and `plan` answered
from facts gathered for the old list ("venv ... does not exist" for a venv that exists).
Facts are gathered here by a fake `gather` that records each call (no host involved).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.config.hosts import Config, load_config
from ddtree_deploy.facts import gather as gather_mod
from ddtree_deploy.facts.cache import FactsCache
from ddtree_deploy.facts.model import Facts, ModelDir, Venv

HOSTS = """\
version: 1
hosts:
  box:
    address: 192.0.2.10
    venvs:
{venvs}
    models:
      default: /models/m
deployments:
{deployments}
"""


def _config(tmp_path: Path, venvs: list[str], draft: str | None = None) -> Config:
    text = HOSTS.format(
        venvs="\n".join(f"      v{i}:\n        path: {p}\n        role: serving"
                         for i, p in enumerate(venvs)),
        deployments=(f"  d:\n    host: box\n    venv: v0\n    algorithm: dflash\n"
                     f"    cuda_lane: cu130\n    sglang: {{version: 0.5.11}}\n"
                     f"    draft_model_path: {draft}\n    gpu: 0\n    port: 30001\n"
                     if draft else "  {}"),
    )
    path = tmp_path / "hosts.yaml"
    path.write_text(text.replace("deployments:\n  {}", "deployments: {}"))
    return load_config(path)


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    seen: list[list[str]] = []

    def fake_gather(config: Config, spec: Any, extra: list[str] | None = None, **_: Any) -> Facts:
        venvs = [str(v.path) for v in spec.venvs.values()] + list(extra or [])
        seen.append(venvs)
        return Facts(host=spec.name, taken_at=__import__("time").time(),
                     venvs=[Venv(path=p, exists=True, declared=True) for p in venvs],
                     models=[ModelDir(path=p) for p in gather_mod.model_paths(config, spec)])

    monkeypatch.setattr(gather_mod, "gather", fake_gather)
    return seen


def _venv_paths(config: Config, cache: FactsCache) -> list[str]:
    (outcome,) = gather_mod.collect(config, ["box"], cache=cache)
    assert outcome.value is not None
    return [v.path for v in outcome.value.venvs]


def test_declaring_another_venv_gathers_again(tmp_path: Path, calls: list[list[str]]) -> None:
    cache = FactsCache(tmp_path / "cache")
    before = _config(tmp_path, ["/opt/a"])
    assert _venv_paths(before, cache) == ["/opt/a"]
    assert _venv_paths(before, cache) == ["/opt/a"] and len(calls) == 1  # cached
    after = _config(tmp_path, ["/opt/a", "/opt/b"])
    assert _venv_paths(after, cache) == ["/opt/a", "/opt/b"]  # not the old facts
    assert len(calls) == 2


def test_a_deployment_naming_another_model_gathers_again(tmp_path: Path,
                                                         calls: list[list[str]]) -> None:
    cache = FactsCache(tmp_path / "cache")
    _venv_paths(_config(tmp_path, ["/opt/a"], draft="/models/draft1"), cache)
    _venv_paths(_config(tmp_path, ["/opt/a"], draft="/models/draft2"), cache)
    assert len(calls) == 2


def test_drop_removes_facts_whatever_they_were_gathered_for(tmp_path: Path,
                                                           calls: list[list[str]]) -> None:
    cache = FactsCache(tmp_path / "cache")
    one, two = _config(tmp_path, ["/opt/a"]), _config(tmp_path, ["/opt/a", "/opt/b"])
    _venv_paths(one, cache)
    _venv_paths(two, cache)
    assert len(list((tmp_path / "cache").glob("box-*.json"))) == 2
    cache.drop(two.host("box"))
    assert list((tmp_path / "cache").glob("box-*.json")) == []
