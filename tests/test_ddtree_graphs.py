"""The round's CUDA-graph cache (payload/ddtree/graphs.py) and the worker's use of it.

On CPU a graph is emulated with what makes one different from an eager call (``Replay``): the
inputs are the graph's own buffers, filled by copying; a replay writes its results into the
buffers the capture returned, so results of an earlier replay are overwritten. The worker's
round through that cache (plan, custom mask, walk: ``DDTreeWorker._plan``/``_finish`` and
``ddtree_prepare_verify`` with the real ``DDTreeVerifyInput``) must commit exactly what the eager
round commits, round after round. On a CUDA machine the real capture is checked against eager.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "payload"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_payload_integration as harness
from ddtree import core
from ddtree.graphs import Captured, CudaCapturer, GraphCache
from test_payload_integration import (
    VOCAB,
    _Alloc,
    _batch,
    _stub,
    _target_forward,
    patched,  # noqa: F401  (fixture)
    sglang_path,  # noqa: F401  (fixture)
    upstream,  # noqa: F401  (fixture)
    verify_mods,  # noqa: F401  (fixture)
)
from test_payload_runtime import _load_verify

from rehearsal.graphs_check import same_tensors


def _copy_into(dst: Any, src: Any) -> None:
    """Write a fresh result into the buffers of the first one, as a graph replay does."""
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        for d, s in zip(dst, src, strict=True):
            _copy_into(d, s)
    elif dataclasses.is_dataclass(dst):
        for f in dataclasses.fields(dst):
            _copy_into(getattr(dst, f.name), getattr(src, f.name))
    else:
        assert dst == src


HOST_READS = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__")


@contextlib.contextmanager
def _no_host_reads() -> Iterator[None]:
    """A graph cannot read device values on the host: here such a read raises."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def refuse(name: str) -> Any:
        def read(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            raise AssertionError(f"host read {name}() inside a captured function")
        return read
    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


class Replay:
    """A CPU stand-in for CUDA graph capture with a graph's buffer semantics (and no host
    reads inside the captured function, as on CUDA)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail, self.captures = fail, 0

    def capture(self, fn: Any, args: Any) -> Captured:
        self.captures += 1
        if self.fail is not None:
            raise self.fail
        statics = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with _no_host_reads():
            outputs = fn(*statics)

        def replay() -> None:
            with _no_host_reads():
                fresh = fn(*statics)
            _copy_into(outputs, fresh)
        return Captured(statics, outputs, replay)


def _cache(fn: Any, capturer: Any = None, **kw: Any) -> GraphCache:
    return GraphCache(fn, capturer=capturer or Replay(), on_cuda=lambda args: True, **kw)


def _round_fn(verify: Any) -> Any:
    def plan(logits: torch.Tensor, roots: torch.Tensor, starts: torch.Tensor) -> Any:
        lp, tok = core.draft_topk(logits, 4)
        p = verify.plan_round(lp, tok, roots, starts, budget=9, score_chain=False)
        return p, verify.custom_mask_index(starts, p.width)
    return plan


def _inputs(gen: torch.Generator, bs: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(bs, 5, 40, generator=gen), torch.randint(0, 40, (bs,), generator=gen),
            torch.randint(1, 30, (bs,), generator=gen))


def test_replays_follow_new_inputs_into_the_graphs_own_buffers() -> None:
    verify = _load_verify()
    fn = _round_fn(verify)
    cache = _cache(fn)
    gen = torch.Generator().manual_seed(4)
    first: dict[int, Any] = {}
    for step in range(6):
        bs = (1, 3)[step % 2]
        args = _inputs(gen, bs)
        got = cache(bs, *args)
        assert same_tensors(got, fn(*args))  # the same answer as an eager call, every time
        if bs in first:
            assert got is first[bs]  # the graph's buffers, overwritten in place
        first[bs] = got
        assert cache.holds(bs, got[0]) and cache.holds(bs, got) and not cache.holds(7, got[0])
    assert cache.counts == {"captured": 2, "replayed": 4, "eager": 0}
    old = first[1][0].tree.tokens.clone()
    cache(1, *_inputs(gen, 1))
    assert not torch.equal(first[1][0].tree.tokens, old)  # what a caller kept has changed


def test_a_bound_object_replays_only_while_it_is_the_same_one() -> None:
    weight = types.SimpleNamespace(w=torch.tensor(2.0))
    other = types.SimpleNamespace(w=torch.tensor(5.0))
    cache = _cache(lambda x, head: x * head.w)
    x = torch.arange(3.0)
    assert torch.equal(cache(3, x, weight), x * 2)
    assert torch.equal(cache(3, x + 1, weight), (x + 1) * 2)
    assert torch.equal(cache(3, x, other), x * 5)  # eager: the graph holds the other object
    assert torch.equal(cache(3, torch.arange(4.0), weight), torch.arange(4.0) * 2)  # new shape
    assert cache.counts == {"captured": 1, "replayed": 1, "eager": 2}


def test_a_failed_capture_runs_eagerly_for_good_and_says_why() -> None:
    said: list[str] = []
    capturer = Replay(fail=RuntimeError("operation not permitted when stream is capturing"))
    cache = _cache(lambda x: x + 1, capturer, on_fail=said.append)
    for i in range(3):
        assert torch.equal(cache(2, torch.tensor([i, i])), torch.tensor([i + 1, i + 1]))
    assert capturer.captures == 1 and not cache.enabled
    assert cache.failed is not None and "stream is capturing" in cache.failed
    assert said == [cache.failed]
    assert cache.counts == {"captured": 0, "replayed": 0, "eager": 3}


def test_keys_beyond_the_limits_run_eagerly() -> None:
    cache = _cache(lambda x: x * 3, max_entries=2, capture_if=lambda bs: bs <= 4)
    for bs in (1, 2, 3, 8, 1):
        assert torch.equal(cache(bs, torch.ones(bs)), torch.full((bs,), 3.0))
    assert cache.counts == {"captured": 2, "replayed": 1, "eager": 2}  # 3: full; 8: too big
    off = _cache(lambda x: x * 3, enabled=False)
    off(1, torch.ones(1))
    assert off.counts["eager"] == 1 and off.counts["captured"] == 0


def test_cpu_tensors_never_reach_the_cuda_capturer() -> None:
    cache = GraphCache(lambda x: x - 1, capturer=CudaCapturer())
    assert torch.equal(cache(1, torch.ones(2)), torch.zeros(2))
    assert cache.counts == {"captured": 0, "replayed": 0, "eager": 1} and cache.failed is None


def test_the_device_mask_index_places_cells_where_the_host_offsets_do() -> None:
    verify = _load_verify()
    gen = torch.Generator().manual_seed(8)
    for bs, n in ((1, 3), (4, 10), (3, 16)):
        lens = torch.randint(0, 40, (bs,), generator=gen)
        mask = torch.rand(bs, n, n, generator=gen) < 0.5
        total = int(sum(n * (int(p) + n) for p in lens))
        host = verify.tree_custom_mask(mask, lens, total)
        index = verify.custom_mask_index(lens, n)
        assert torch.equal(verify.tree_custom_mask(mask, lens, total, index=index), host)
        assert index.unique().numel() == bs * n * n  # no two cells in one place


# --- the worker's round through the cache -----------------------------------------------------


def _worker(sglang_pkg: Path, monkeypatch: pytest.MonkeyPatch, graphs: str) -> Any:
    """The real ``DDTreeWorker`` methods on an object holding only what a round reads."""
    monkeypatch.setenv("SGLANG_DDTREE_ROUND_GRAPHS", graphs)
    group = types.SimpleNamespace(world_size=1)
    stubs: dict[str, dict[str, Any]] = {
        "sglang.srt.distributed": {"get_tp_group": lambda: group},
        "sglang.srt.model_executor.forward_batch_info": {
            "ForwardMode": types.SimpleNamespace(
                TARGET_VERIFY=types.SimpleNamespace(is_idle=lambda: False)),
            "CaptureHiddenMode": types.SimpleNamespace(NULL=0, FULL=1)},
        "sglang.srt.server_args": {"ServerArgs": object},
        "sglang.srt.speculative.dflash_utils": {
            "resolve_dflash_verify_mask_policy": lambda backend: ("TritonAttnBackend", True),
            "is_dflash_sampling_verify_available": lambda: False},
        "sglang.srt.speculative.dflash_worker": {"DFlashWorker": object},
    }
    for name, attrs in stubs.items():
        monkeypatch.setitem(sys.modules, name, _stub(name, **attrs))
    monkeypatch.delitem(sys.modules, "sglang.srt.speculative.ddtree_worker", raising=False)
    import sglang.srt.speculative.ddtree_worker as module

    monkeypatch.setattr(module, "GraphCache", functools.partial(
        GraphCache, capturer=Replay(), on_cuda=lambda args: True))
    w = object.__new__(module.DDTreeWorker)
    w.__dict__.update(ddtree_budget=10, ddtree_topk=4, ddtree_shadow_linear=False,
                      ddtree_score_chain=False, page_size=1, _rounds=0, _tree_expected=None,
                      _chain_expected=None,
                      model_runner=types.SimpleNamespace(attn_backend=object()))
    w._plan_graphs, w._walk_graphs = w._round_graphs(
        types.SimpleNamespace(cuda_graph_max_bs=8, disable_cuda_graph=False))
    return w


def _draft(batch: Any, gen: torch.Generator, depths: int = 4) -> tuple[torch.Tensor, ...]:
    """The drafter's block for this round: the true continuation at rank 0 or 1 of each depth."""
    bs = batch.batch_size()
    logits = torch.randn(bs, depths, VOCAB, generator=gen)
    for b in range(bs):
        at = int(batch.seq_lens[b])
        for d in range(depths):
            want = harness.TRUE[at + 1 + d]
            logits[b, d, want] = 6.0 if float(torch.rand(1, generator=gen)) < 0.6 else 5.0
            if float(logits[b, d].max()) < 6.0:
                logits[b, d, (want + 3) % VOCAB] = 6.0  # a decoy ranked above the truth
    hidden = torch.cat([torch.zeros(bs, 1, VOCAB), logits], 1)  # slot 0: the root's, unused
    roots = torch.tensor([r.output_ids[-1] for r in batch.reqs])
    block_ids = torch.cat([roots[:, None], torch.zeros(bs, depths, dtype=torch.long)], 1)
    return block_ids, hidden


def _serve(w: Any, rounds: int) -> tuple[list[list[int]], list[list[int]]]:
    """Rounds of two batches in turn (2 requests, then 1: the cache switches keys)."""
    head = types.SimpleNamespace(weight=torch.eye(VOCAB), shard_indices=types.SimpleNamespace(
        num_added_elements=0, num_org_elements=VOCAB, org_vocab_start_index=0))
    gen = torch.Generator().manual_seed(21)
    batches = []
    for prompts in ([harness.TRUE[:1], harness.TRUE[:2]], [harness.TRUE[:3]]):
        kv: dict[int, tuple[int, int]] = {}
        batches.append((_batch(prompts, kv, _Alloc()), kv))
    accepted: list[list[int]] = []
    for _ in range(rounds):
        for batch, kv in batches:
            batch.forward_mode = types.SimpleNamespace(is_idle=lambda: False)
            block_ids, hidden = _draft(batch, gen)
            w.ddtree_prepare_verify(batch, block_ids, hidden, head)
            spec = batch.spec_info
            *_, acc = spec.verify(batch=batch, logits_output=_target_forward(batch, spec, kv),
                                  page_size=1)
            accepted.append(acc)
    return [r.output_ids for batch, _ in batches for r in batch.reqs], accepted


def test_the_workers_graph_round_commits_what_its_eager_round_commits(
        sglang_path: Path, verify_mods: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(harness, "TRUE", list(range(10, VOCAB)))  # room for 3 rounds
    graphed = _worker(sglang_path, monkeypatch, "1")
    outputs, accepted = _serve(graphed, 3)
    eager = _worker(sglang_path, monkeypatch, "0")
    assert not eager._plan_graphs.enabled and graphed._plan_graphs.enabled
    assert _serve(eager, 3) == (outputs, accepted)
    for out, start in zip(outputs, (1, 2, 3), strict=True):
        assert out == harness.TRUE[start : start + len(out)]  # lossless: the target's text
    assert sum(map(sum, accepted)) >= 6  # the tree was accepted, not only bonus tokens
    assert graphed._plan_graphs.counts == {"captured": 2, "replayed": 4, "eager": 0}
    assert graphed._walk_graphs.counts == {"captured": 2, "replayed": 4, "eager": 0}
    assert eager._plan_graphs.counts == {"captured": 0, "replayed": 0, "eager": 6}


def test_a_batch_above_the_graphs_limit_walks_eagerly(
        sglang_path: Path, verify_mods: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(harness, "TRUE", list(range(10, VOCAB)))
    w = _worker(sglang_path, monkeypatch, "1")
    w._plan_graphs, w._walk_graphs = w._round_graphs(
        types.SimpleNamespace(cuda_graph_max_bs=1, disable_cuda_graph=False))
    outputs, _ = _serve(w, 2)  # the batch of 2 > 1 runs eagerly, the batch of 1 from graphs
    for out, start in zip(outputs, (1, 2, 3), strict=True):
        assert out == harness.TRUE[start : start + len(out)]
    assert w._plan_graphs.counts == {"captured": 1, "replayed": 1, "eager": 2}
    assert w._walk_graphs.counts == {"captured": 1, "replayed": 1, "eager": 0}  # eager: _finish
    off = w._round_graphs(types.SimpleNamespace(cuda_graph_max_bs=8, disable_cuda_graph=True))
    assert not off[0].enabled and not off[1].enabled


def test_the_graphs_limit_is_the_least_of_the_servers_and_the_payloads(
        sglang_path: Path, verify_mods: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    w = _worker(sglang_path, monkeypatch, "1")
    args = types.SimpleNamespace(cuda_graph_max_bs=256, disable_cuda_graph=False,
                                 max_running_requests=None)
    for env, running, want in (("", None, 32), ("", 12, 12), ("64", None, 64), ("64", 40, 40),
                               ("2", 40, 2)):
        monkeypatch.setenv("SGLANG_DDTREE_ROUND_GRAPHS_MAX_BS", env)
        args.max_running_requests = running
        plans, _ = w._round_graphs(args)
        assert plans.max_entries == want
        assert plans._capture_if(want) and not plans._capture_if(want + 1)


def test_a_failed_capture_turns_both_of_the_workers_caches_off(
        sglang_path: Path, verify_mods: Any,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(harness, "TRUE", list(range(10, VOCAB)))
    w = _worker(sglang_path, monkeypatch, "1")
    outputs, _ = _serve(w, 1)  # both caches hold graphs now
    assert w._walk_graphs.counts["captured"] == 2
    w._plan_graphs._entries.clear()  # the next plan of a batch size captures again ...
    w._plan_graphs._capturer = Replay(fail=RuntimeError("capture invalidated"))  # ... and fails
    more, _ = _serve(w, 1)
    assert not w._plan_graphs.enabled and not w._walk_graphs.enabled
    assert w._walk_graphs._entries == {} and "capture invalidated" in str(w._walk_graphs.failed)
    assert "DDTREE round graphs off (RuntimeError: capture invalidated)" in caplog.text
    for out, start in zip(more, (1, 2, 3), strict=True):
        assert out == harness.TRUE[start : start + len(out)]


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="captures real CUDA graphs (torch.cuda.CUDAGraph), which need a CUDA "
                           "GPU; on the CPU the Replay capturer above stands in for them")
def test_cuda_graphs_replay_the_round_as_eager_runs_it() -> None:
    verify = _load_verify()
    fn = _round_fn(verify)
    plan_cache = GraphCache(fn)
    walk_cache = GraphCache(verify.finish_and_pack)
    gen = torch.Generator().manual_seed(5)
    for step in range(8):
        bs = (1, 4)[step % 2]
        args = tuple(t.cuda() for t in _inputs(gen, bs))
        got = plan_cache(bs, *args)
        want = fn(*args)
        assert same_tensors(got, want)
        target = torch.randint(0, 40, tuple(want[0].tree.tokens.shape), generator=gen).cuda()
        assert plan_cache.holds(bs, got[0])
        assert same_tensors(walk_cache(bs, got[0], target), verify.finish_and_pack(want[0], target))
    assert plan_cache.failed is None and plan_cache.counts["captured"] == 2
    assert walk_cache.counts["replayed"] == 6
