"""plan over a fleet and the saved plan (issue 30, items 5 and 3).

Item 5: hosts are planned in parallel; one that cannot be planned (a closed port on
loopback: connection refused) is an error of the plan, shown with the other hosts' steps,
and the exit code is 3 (3 wins over 4: changes are pending on the reachable host).
Item 3: `apply --plan FILE` runs exactly the saved plan: a hosts file edited since (port,
budget), another tool version or a plan that does not record them are refused before any
host is contacted; without --yes the saved plan is shown before the question.

ct200's facts come from a seeded cache (as tests/golden.py seeds them): no host is contacted
(both hosts are closed ports on loopback, should a regression try).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from golden import CU130, story_facts
from test_remedies import parse
from typer.testing import CliRunner

from ddtree_deploy.cli import converge as cli_converge
from ddtree_deploy.cli.app import build_app
from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.converge import runner
from ddtree_deploy.facts.cache import FactsCache
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.resources import embedded_hosts_file
from ddtree_deploy.rules.findings import commands_of

GONE = """
  gone:
    address: 127.0.0.1
    port: 1                       # nothing listens: connection refused
    ssh_persist: 0
    connect_timeout: 5
"""


@pytest.fixture()
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    text = embedded_hosts_file().read_text()
    head, sep, tail = text.partition("\ndeployments:")
    hosts = tmp_path / "hosts.yaml"
    # ct200 on a closed loopback port too: a regression that connects is refused at once
    assert text.count("address: 10.77.200.2\n    port: 22\n") == 1
    head = head.replace("address: 10.77.200.2\n    port: 22\n", "address: 127.0.0.1\n    port: 1\n")
    hosts.write_text(head.rstrip("\n") + "\n" + GONE + sep + tail)
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("DDTREE_DEPLOY_HOSTS", raising=False)
    config = load_config(hosts)
    data = story_facts(True, {k: v for k, v in CU130.items() if k != "soundfile"})
    data["tool"] = {"managed_units": {}, "pending_restarts": []}
    import time

    data["taken_at"] = time.time()
    FactsCache(state / "ddtree-deploy" / "facts").save(config.host("ct200"),
                                                        Facts.model_validate(data))
    return {"hosts": hosts, "root": tmp_path}


def cli(world: dict[str, Any], *args: str, stdin: str | None = None) -> tuple[int, str, Any]:
    full = ["--hosts", str(world["hosts"]), *args]
    result = CliRunner().invoke(build_app(full), full, input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        from ddtree_deploy.errors import DeployError

        assert isinstance(result.exception, DeployError), result.exception
        return int(result.exception.exit_code), str(result.exception), result.exception
    return result.exit_code, result.output, None


def test_an_unreachable_host_does_not_hide_the_others(world: dict[str, Any]) -> None:
    code, text, _ = cli(world, "plan", "ct200", "gone")
    assert code == 3, text  # 3 wins over 4
    assert "package.install" in text and "soundfile==0.13.1" in text
    assert "gone: not planned" in text and "127.0.0.1" in text
    code, text, _ = cli(world, "plan", "ct200", "gone", "--json")
    assert code == 3
    doc = json.loads(text)["results"]  # docs/json.md
    assert set(doc["errors"]) == {"gone"} and doc["errors"]["gone"]["exit_code"] == 1
    assert {s["host"] for s in doc["steps"]} == {"ct200"} and doc["changes"] > 0


def test_one_host_that_fails_is_its_error(world: dict[str, Any]) -> None:
    code, text, exc = cli(world, "plan", "gone")
    assert code == 1 and exc is not None and "gone" in text


def test_hosts_are_planned_in_parallel(world: dict[str, Any],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each host's planning waits for the other's to have started: sequential planning
    would break the barrier (its timeout only guards against a hang)."""
    barrier = threading.Barrier(2, timeout=120)
    real = runner.plan_for

    def meeting(config: Any, host: Any, *, refresh: bool) -> Any:
        barrier.wait()
        return real(config, host, refresh=refresh)

    monkeypatch.setattr(runner, "plan_for", meeting)
    code, text, _ = cli(world, "plan", "ct200", "gone", "--json")
    assert code == 3, text
    assert not barrier.broken


def test_plan_says_how_old_its_cached_facts_are(world: dict[str, Any]) -> None:
    config = load_config(world["hosts"])
    cache = FactsCache(world["root"] / "state" / "ddtree-deploy" / "facts")
    facts = cache.load(config.host("ct200"))
    assert facts is not None
    cache.save(config.host("ct200"), facts.model_copy(update={"taken_at": facts.taken_at - 120}))
    code, text, _ = cli(world, "plan", "ct200")
    assert code == 4
    assert "ct200: planned on facts taken 12" in text and "--refresh" in text


def _saved(world: dict[str, Any]) -> Path:
    out = world["root"] / "plan.json"
    code, text, _ = cli(world, "plan", "ct200", "--out", str(out))
    assert code == 4, text
    return out


@pytest.mark.parametrize(("old", "new"), [("port: 30001", "port: 30002"),
                                          ("budget: 15 ", "budget: 31 ")])
def test_apply_refuses_a_plan_whose_deployment_was_edited(world: dict[str, Any], old: str,
                                                          new: str) -> None:
    saved = _saved(world)
    text = world["hosts"].read_text()
    assert old in text
    world["hosts"].write_text(text.replace(old, new))
    code, out, _ = cli(world, "apply", "--plan", str(saved), "--yes")
    assert code == 1, out
    assert "changed since the plan was made: deployment sglang-ddtree" in out
    assert f"`ddtree-deploy plan ct200 --out {saved}`" in out


def test_apply_refuses_a_plan_of_another_version_or_unpinned(world: dict[str, Any]) -> None:
    saved = _saved(world)
    doc = json.loads(saved.read_text())
    saved.write_text(json.dumps(dict(doc, tool_version="0.0.1")))
    code, text, exc = cli(world, "apply", "--plan", str(saved), "--yes")
    assert code == 1 and "made by ddtree-deploy 0.0.1" in text and exc is not None
    (again,) = commands_of(exc.hint)  # the command that makes it anew, one the CLI accepts
    assert again == f"ddtree-deploy plan ct200 --out {saved}"
    parse(again)
    saved.write_text(json.dumps({k: v for k, v in doc.items()
                                 if k not in ("tool_version", "specs")}))
    code, text, _ = cli(world, "apply", "--plan", str(saved), "--yes")
    assert code == 1 and "did not record itself" in text


def test_apply_shows_the_saved_plan_before_asking(world: dict[str, Any],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    saved = _saved(world)
    monkeypatch.setattr(cli_converge, "can_ask", lambda: True)
    code, text, _ = cli(world, "apply", "--plan", str(saved), stdin="n\n")
    assert code == 1
    shown, asked = text.index("soundfile==0.13.1"), text.index("Apply to ct200?")
    assert f"the saved plan {saved}" in text and shown < asked


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_apply_with_an_unknown_host_does_nothing(world: dict[str, Any],
                                                 json_flag: list[str]) -> None:
    """A typo among apply's hosts is exit 2 before any host is touched or any run logged
    (it was one failed host among the others, converged anyway, and `"ok": true`)."""
    from ddtree_deploy.errors import ConfigError

    code, text, exc = cli(world, "apply", "ct200", "ct20", "--yes", *json_flag)
    assert code == 2 and isinstance(exc, ConfigError), text
    assert "unknown host 'ct20' (did you mean 'ct200'" in text
    assert not (world["root"] / "state" / "ddtree-deploy" / "runs").exists()


def test_apply_does_not_ask_to_apply_a_plan_it_could_not_make(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """One host that cannot be planned (unreachable): its error, exit 1, and no question
    (it asked "Apply to gone? [y/N]" under the error)."""
    monkeypatch.setattr(cli_converge, "can_ask", lambda: True)
    code, text, exc = cli(world, "apply", "gone", stdin="y\n")
    assert code == 1 and exc is not None, text
    assert "gone (127.0.0.1:1) unreachable" in text and "Apply to" not in text
