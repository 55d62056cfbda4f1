"""bench grids: the YAML file and the flags, validated with file:line:field messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_deploy.bench import grid, workloads
from ddtree_deploy.errors import ExitCode, RefusedError
from ddtree_deploy.settings.layers import merge
from ddtree_deploy.settings.model import HostFit

REPO = Path(__file__).resolve().parents[1]
KNOWN = workloads.names()


def test_committed_h200_grid_is_the_lead_s_small_grid() -> None:
    g = grid.load(REPO / "benchmarks" / "grids" / "h200-small.yaml", KNOWN)
    assert [c.key for c in g.configs] == ["nospec", "dflash", "ddtree-15-8", "ddtree-31-8"]
    assert g.concurrency == (1, 8) and g.sampling == ("greedy", "sampled")
    assert g.prompts == "ids"
    on_host(g, 16)  # 15 + 1 = 16: allowed
    with pytest.raises(RefusedError) as info:
        on_host(g, 32)
    assert "h200-small.yaml:" in str(info.value)
    assert "configs[2].budget: DDTREE budget 15 gives a verify width of 16 tokens" \
        in str(info.value)
    assert "below the drafter's block size 32" in str(info.value)


def on_host(g: grid.Grid, block: int) -> None:
    """Each configuration checked against a drafter of `block` tokens (what bench's prepare
    does over the deployment's settings, with the drafter's config.json)."""
    for c in g.configs:
        merge(c.layer, partial=True).on_host(HostFit(host="h", draft_block=block))


def _load(tmp_path: Path, text: str) -> grid.Grid:
    f = tmp_path / "g.yaml"
    f.write_text(text)
    return grid.load(f, KNOWN)


def test_budget_below_the_block_is_refused_with_its_line(tmp_path: Path) -> None:
    g = _load(tmp_path, "configs:\n  - algorithm: dflash\n  - algorithm: ddtree\n"
                        "    topk: 8\n    budget: 7\n  - ddtree:31/8\n"
                        "concurrency: [1]\nrequests: 2\n")
    with pytest.raises(RefusedError) as info:
        on_host(g, 16)
    err = info.value
    assert str(err).startswith(f"{tmp_path / 'g.yaml'}:5: configs[1].budget: DDTREE budget 7 "
                               "gives a verify width of 8 tokens")
    assert "configs[2]" not in str(err)
    on_host(g, 8)  # 7 + 1 = 8: fine
    # shadow-linear verifies the chain only: its budget is not a verify width
    on_host(_load(tmp_path, "configs: [shadow:3/2]\nconcurrency: [1]\nrequests: 1\n"), 16)


@pytest.mark.parametrize(("text", "message"), [
    ("configs: []\n", "g.yaml:1: configs: a non-empty list"),
    ("configs: [dflash]\nbogus: 1\n", "g.yaml:2: bogus: unknown key"),
    ("configs:\n  - algorithm: eagle\n", "g.yaml:2: configs[0].algorithm: expected none, dflash"),
    ("configs:\n  - algorithm: dflash\n    budget: 3\n",
     "g.yaml:3: configs[0].budget: only allowed with algorithm: ddtree"),
    ("configs:\n  - algorithm: ddtree\n    budget: 15\n",
     "g.yaml:2: configs[0].topk: required with algorithm ddtree"),
    ("configs:\n  - algorithm: ddtree\n    budget: 0\n    topk: 8\n",
     "g.yaml:3: configs[0].budget: must be 1-1024, got 0"),
    ("configs:\n  - {algorithm: ddtree, budget: 15, topk: 8, colour: red}\n",
     "g.yaml:2: configs[0].colour: unknown key"),
    ("configs: [dflash]\nconcurrency: [1, 1]\n", "g.yaml:2: concurrency: give distinct"),
    ("configs: [dflash]\nconcurrency: [0]\n", "g.yaml:2: concurrency: each value must be"),
    ("configs: [dflash]\nworkloads: [code, poetry]\n", "g.yaml:2: workloads: expected distinct"),
    ("configs: [dflash]\nsampling: greedy\nprompts: tokens\n", "g.yaml:3: prompts: expected"),
    ("configs: [dflash, dflash]\nrequests: 16\n", "configurations listed twice: dflash"),
    ("configs: [dflash]\nconcurrency: [1, 16]\nrequests: 4\n",
     "requests: 4 per cell cannot reach concurrency 16"),
    ("configs: [ddtree]\n", "needs BUDGET/TOPK"),
    ("configs: [dflash\n", "g.yaml:2:1: YAML syntax error"),
    ("- just a list\n", "the grid must be a mapping"),
])
def test_bad_grids_are_refused_with_file_line_and_field(tmp_path: Path, text: str,
                                                        message: str) -> None:
    with pytest.raises(Exception) as info:
        _load(tmp_path, text)
    assert getattr(info.value, "exit_code", None) == ExitCode.USAGE
    assert message in str(info.value)


def test_flags_make_the_same_grid_as_the_file(tmp_path: Path) -> None:
    flags = grid.from_flags("none,dflash,ddtree:15/8,shadow:15/8", "1,8", "greedy", "code,json",
                            KNOWN, requests=8)
    file = _load(tmp_path, "configs: [none, dflash, 'ddtree:15/8', {algorithm: ddtree, "
                           "budget: 15, topk: 8, shadow_linear: true}]\nconcurrency: [1, 8]\n"
                           "sampling: [greedy]\nworkloads: [code, json]\nrequests: 8\n")
    assert flags.configs == file.configs
    assert [c.key for c in flags.configs] == ["nospec", "dflash", "ddtree-15-8",
                                              "ddtree-15-8-shadow"]
    assert (flags.concurrency, flags.sampling, flags.workloads) == \
        (file.concurrency, file.sampling, file.workloads)
    with pytest.raises(Exception, match="--configs: 'ddtree:x' is not a configuration"):
        grid.from_flags("ddtree:x", "1", "greedy", "code", KNOWN)
    with pytest.raises(Exception, match="--concurrency: 'a' is not an integer"):
        grid.from_flags("dflash", "a", "greedy", "code", KNOWN)


def test_workload_sessions_are_stable_token_ids_below_the_vocabulary() -> None:
    a = workloads.sessions("agentic", 3, ids=True, vocab=1024)
    assert a == workloads.sessions("agentic", 3, ids=True, vocab=1024)
    assert all(0 < t < 1024 for s in a for t in s["prompt"] + [x for tl in s["tools"] for x in tl])
    assert all(len(s["tools"]) == workloads.get("agentic").turns - 1 for s in a)
    text = workloads.sessions("code", 6, ids=False, vocab=1024)
    assert [s["tools"] for s in text] == [[]] * 6
    assert text[0]["prompt"] == text[5]["prompt"]  # five prompts, sent in turn
    assert set(workloads.names()) >= {"code", "math", "json", "chat", "agentic"}
