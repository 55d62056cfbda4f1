"""Host waits in a DDTREE round, counted on CPU (benchmarks/ddtree_round_syncs.py), and the
drafter's KV append that avoids them writing what SGLang 0.5.11's own append writes.

A sync is a device->host read (``.cpu()``, ``.item()``, ``.tolist()`` of device data, boolean-mask
indexing) or a blocking host->device copy (torch waits for the stream after one). The round's
tail runs as SGLang runs it: the draft tail, the verify (fake target), the append. DDTREE keeps
exactly one: the accepted tokens and path read on the host, which the scheduler needs. The GPU's
own count (profiler) comes from the rehearsal's perf-8b phase.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ddtree_host_ops as ops  # noqa: E402
import ddtree_round_syncs as syncs  # noqa: E402
from test_payload_integration import (  # noqa: E402
    patched,  # noqa: F401  (fixture)
    sglang_path,  # noqa: F401  (fixture)
    upstream,  # noqa: F401  (fixture)
)
from wheelcache import wheel  # noqa: E402


@pytest.fixture()
def mods(sglang_path: Path) -> tuple[Any, ops.Session]:  # noqa: F811
    session = ops.Session()
    return ops.load(sglang_path, session), session


@pytest.mark.parametrize("bs", [1, 8])
def test_a_ddtree_round_waits_on_the_host_once(mods: tuple[Any, ops.Session], bs: int) -> None:
    loaded, session = mods
    s = ops.Sizes(bs, vocab=512, hidden=32)
    weight = torch.randn(s.vocab, s.hidden).to(s.dtype)
    ddtree = syncs.count(loaded, session, "ddtree", s, weight)
    assert dict(ddtree.syncs) == {"D2H copy (.cpu())": 1}
    assert ddtree.split == {"prepare": 0, "verify": 1, "append": 0}
    # the instrument sees DFLASH's (0.5.11's own code): blocking copies, the fused append's
    # .item(), and at batch > 1 its boolean-mask gathers
    dflash = syncs.count(loaded, session, "dflash", s, weight)
    assert dflash.syncs["H2D blocking (tensor(device=))"] >= 1
    assert dflash.syncs["D2H read (.item())"] == 1
    assert dflash.syncs["index (bool mask)"] == (4 if bs > 1 else 2)


def _pool(me: Any) -> list[torch.Tensor]:
    p = me.draft_model_runner.token_to_kv_pool
    return [t.clone() for t in (*p.k, *p.v)]


@pytest.mark.parametrize(("bs", "fused", "graph"), [(1, True, False), (3, True, False),
                                                   (3, False, False), (1, True, True),
                                                   (3, True, True)])
def test_the_staged_append_writes_what_sglangs_own_append_writes(
        mods: tuple[Any, ops.Session], bs: int, fused: bool, graph: bool) -> None:
    """``graph``: the fixed-shape append (padding rows write the dummy slot 0) replayed from a
    graph stand-in with a graph's buffer semantics and no host reads (test_ddtree_graphs)."""
    from test_ddtree_graphs import Replay

    loaded, session = mods
    s = ops.Sizes(bs, vocab=512, hidden=32, prefix=24)
    weight = torch.randn(s.vocab, s.hidden).to(s.dtype)
    me = syncs.draft_side(ops.ddtree_self(loaded, s), s, session, 4096)
    if graph:
        me._kv_graphs = loaded.worker.GraphCache(me._kv_fixed, capturer=Replay(),
                                                 on_cuda=lambda args: True)
    written: list[tuple[torch.Tensor, ...]] = []

    def sequential(ctx_hidden: torch.Tensor, positions: torch.Tensor, loc: torch.Tensor) -> None:
        written.append((ctx_hidden.clone(), positions.clone(), loc.clone()))

    me._append_target_hidden_sequential = sequential
    me._use_fused_kv_materialize = fused
    for seed in (1, 2):  # two rounds: the second starts from the first's lengths
        x = ops.make_inputs(s, seed, weight)
        out = ops.run_round(me, x, s)
        spec, batch = x.batch.spec_info, x.batch
        ctx = spec.draft_ctx
        assert ctx is not None and ctx.cache_loc is batch.out_cache_loc
        assert (ctx.padded is not None) == graph
        before = _pool(me)
        staged = syncs.append_after(me, batch, out)
        assert spec.draft_ctx is None  # used once
        mine, mine_written = _pool(me), list(written)
        # SGLang's own append (device gathers) on the same round, from the same pool
        for t, old in zip((*me.draft_model_runner.token_to_kv_pool.k,
                           *me.draft_model_runner.token_to_kv_pool.v), before, strict=True):
            t.copy_(old)
        written.clear()
        own = syncs.append_after(me, batch, out)
        # slot 0: SGLang's dummy slot, where the fixed-shape append's padding rows go
        theirs = _pool(me)
        for a, b, was in zip(mine, theirs, before, strict=True):
            # the same rows written (slot 0 aside) ...
            assert torch.equal((a[1:] != was[1:]).flatten(1).any(1),
                               (b[1:] != was[1:]).flatten(1).any(1))
            # ... with the same values: bit for bit eagerly; the fixed shape multiplies more rows
            # at once, which may round the last bits differently (CPU bf16 matmuls)
            assert torch.equal(a[1:], b[1:]) if not graph else \
                torch.allclose(a[1:], b[1:], rtol=1e-4, atol=1e-4)
        assert len(mine_written) == len(written)
        for a, b in zip(mine_written, written, strict=True):
            assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
        assert torch.equal(staged.draft_seq_lens, own.draft_seq_lens)
        assert staged.target_hidden.shape[0] == own.target_hidden.shape[0] == 0
        assert torch.equal(staged.ctx_lens, own.ctx_lens)
        if fused:  # the KV was really written: committed tokens' rows changed
            assert any(not torch.equal(a[1:], b[1:]) for a, b in zip(mine, before, strict=True))
        written.clear()
    if graph:
        assert me._kv_graphs.counts == {"captured": 1, "replayed": 1, "eager": 0}


def test_the_draft_prelude_reads_the_drafters_lengths_from_the_host(
        mods: tuple[Any, ops.Session]) -> None:
    loaded, _ = mods
    me = object.__new__(loaded.worker.DDTreeWorker)
    batch = types.SimpleNamespace(seq_lens_cpu=torch.tensor([5, 9]))
    me.use_compact_draft_cache = False
    assert me.ddtree_draft_lens_cpu(batch) is batch.seq_lens_cpu
    me.use_compact_draft_cache = True  # a draft window: DFlash's own device lengths
    assert me.ddtree_draft_lens_cpu(batch) is None


def test_the_benchmarks_sglang_is_the_deployed_patch_set(patched: Path,  # noqa: F811
                                                         tmp_path: Path) -> None:
    """ddtree_host_ops.py's own patched tree (what its table measures) is the wheel with every
    patch of payload.yaml applied and its files copied, byte for byte as the payload tests'
    tree: it once extracted a list of folders and failed on the first patch outside them."""
    pkg = ops.patched_package(wheel("sglang", "0.5.11"), tmp_path)

    def files(root: Path) -> list[Path]:
        # the shared tree is imported by other tests first: their bytecode is not the payload's
        return sorted(p.relative_to(root) for p in root.rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts)

    theirs = files(patched)
    assert files(pkg) == theirs
    assert [p for p in theirs if (pkg / p).read_bytes() != (patched / p).read_bytes()] == []
