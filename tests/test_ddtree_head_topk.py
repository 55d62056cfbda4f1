"""The drafter's top-k over the target's LM head exists once (payload/ddtree/vocab.py,
``head_topk``): both payload forms' workers take it from there, and it equals the unsharded
top-k of the head's logits for one rank (chunked or not, with a vocabulary offset) and for a
simulated tensor-parallel group whose shards are smaller than k."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload"))

from ddtree import core, vocab  # noqa: E402
from test_payload_runtime import _run_ranks, _shards  # noqa: E402

WORKERS = (ROOT / "payload/plugin/ddtree_sglang/worker.py",
           ROOT / "payload/sglang-0.5.11/srt/speculative/ddtree_worker.py")


def _head(weight: torch.Tensor, num_org: int, start: int = 0, added: int = 0) -> object:
    return types.SimpleNamespace(weight=weight, shard_indices=types.SimpleNamespace(
        num_added_elements=added, num_org_elements=num_org, org_vocab_start_index=start))


@pytest.mark.parametrize(("start", "chunk_rows"), [(0, None), (7, 4), (3, 1)])
def test_one_rank_equals_the_top_k_of_the_whole_head(start: int, chunk_rows: int | None) -> None:
    vocab_size, k = 50, 6
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 5, 16, generator=gen)
    weight = torch.randn(vocab_size + 2, 16, generator=gen)  # + 2 padding rows, never read
    want_lp, want_ids = core.draft_topk(hidden @ weight[:vocab_size].T, k, backend="torch")
    chunk = vocab.CHUNK_ELEMENTS if chunk_rows is None else chunk_rows * vocab_size
    lp, ids = vocab.head_topk(hidden, _head(weight, vocab_size, start), k,
                              types.SimpleNamespace(world_size=1),
                              lambda x, n: core.draft_topk(x, n, backend="torch"),
                              chunk_elements=chunk)
    assert lp.shape == ids.shape == (3, 5, k)
    assert torch.allclose(lp, want_lp, atol=1e-5) and torch.equal(ids, want_ids + start)


def test_a_simulated_tp_group_equals_the_unsharded_top_k() -> None:
    vocab_size, world, k = 11, 4, 8  # shards of 3, 3, 3, 2 tokens: all smaller than k
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 3, 16, generator=gen)
    weight = torch.randn(vocab_size, 16, generator=gen)
    want_lp, want_ids = core.draft_topk(hidden @ weight.T, k, backend="torch")

    def rank_fn(rank: int, group: object) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = _shards(vocab_size, world)[rank]
        head = _head(torch.cat([weight[lo:hi], torch.zeros(1, 16)]), hi - lo, lo)
        return vocab.head_topk(hidden, head, k, group, core.draft_topk)

    for lp, ids in _run_ranks(world, rank_fn):
        assert torch.allclose(lp, want_lp, atol=1e-5) and torch.equal(ids, want_ids)


def test_an_added_vocabulary_head_is_refused() -> None:
    head = _head(torch.zeros(4, 2), 3, added=1)
    with pytest.raises(RuntimeError, match="added-vocabulary"):
        vocab.head_topk(torch.zeros(1, 1, 2), head, 2, types.SimpleNamespace(world_size=1),
                        core.draft_topk)


@pytest.mark.parametrize("path", WORKERS, ids=lambda p: p.parent.name)
def test_each_worker_takes_its_top_k_from_the_shared_function(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    method = next(n for n in ast.walk(tree)
                  if isinstance(n, ast.FunctionDef) and n.name == "_draft_topk")
    called = {n.func.id for n in ast.walk(method)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "head_topk" in called, f"{path}: _draft_topk does not call head_topk"
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & {"row_chunks", "topk_logprobs"}, f"{path} chunks the head itself"
