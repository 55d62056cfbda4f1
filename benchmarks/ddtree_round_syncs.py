"""Host waits in a round's tail, DFLASH against DDTREE, on CPU: the draft tail, the verify and the
drafter's KV append after it (``_append_target_hidden_to_draft_kv``), as SGLang 0.5.11 runs them.

    .venv/bin/python benchmarks/ddtree_round_syncs.py [--wheel PATH] [--payload DIR]

Built on ``ddtree_host_ops`` (its counter, its fakes, the patched wheel): DFLASH's append is the
wheel's own method (its device gathers with boolean masks at batch > 1, its fused path with
``positions.max().item()``, as 0.5.11's ``FusedKVMaterializeHelper.materialize`` does: a CPU
stand-in of that helper, below, since the real one imports Triton); DDTREE's is the payload's
override (positions and cache locations staged by its verify). A sync is a device->host read or a
blocking host->device copy (see ``ddtree_host_ops``). Not covered here: the draft forward's
prelude (the payload's patch of ``_prepare_for_speculative_decoding`` reads the drafter's lengths
from the host instead of two device reads) and the forward passes themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ddtree_host_ops as ops

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 4


class FusedHelper:
    """0.5.11's ``FusedKVMaterializeHelper`` as the worker uses it: stacked K/V projections,
    ``materialize`` = the largest position read on the host, one batched projection, then per
    layer ``_fused_norm_rope`` and the pool's write (the wheel's order)."""

    def __init__(self, hidden: int, session: ops.Session) -> None:
        gen = torch.Generator().manual_seed(4)
        self.batched_kv_weight = torch.randn(LAYERS, 2 * KV_HEADS * HEAD_DIM, hidden,
                                             generator=gen)
        self.k_norm_weights = [torch.ones(HEAD_DIM)] * LAYERS
        self.eps_values = [1e-6] * LAYERS
        self.n_layers, self.num_kv_heads, self.head_dim, self.rotary_dim = \
            LAYERS, KV_HEADS, HEAD_DIM, HEAD_DIM
        self.rotary_emb = types.SimpleNamespace(cos_sin_cache=torch.zeros(4096, HEAD_DIM))
        session.tracker.add([self.batched_kv_weight, *self.k_norm_weights,
                             self.rotary_emb.cos_sin_cache])

    def materialize(self, ctx_hidden: torch.Tensor, positions: torch.Tensor,
                    write_layer_kv: Any) -> None:
        norm_rope = sys.modules["sglang.srt.speculative.triton_ops.fused_kv_materialize"]
        max_position = int(positions.max().item())  # as 0.5.11 does
        assert max_position < int(self.rotary_emb.cos_sin_cache.shape[0])
        kv_all = torch.einsum("th,loh->lto", ctx_hidden, self.batched_kv_weight)
        for layer in range(self.n_layers):
            k, v = norm_rope._fused_norm_rope(kv_all[layer], self.k_norm_weights[layer],
                                              self.rotary_emb.cos_sin_cache, positions,
                                              KV_HEADS, HEAD_DIM, HEAD_DIM)
            write_layer_kv(layer, k, v)


class Pool:
    """The drafter's KV pool: one K and one V buffer a layer; ``set_kv_buffer`` writes rows."""

    def __init__(self, size: int, session: ops.Session) -> None:
        self.k = [torch.zeros(size, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]
        self.v = [torch.zeros(size, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]
        session.tracker.add([*self.k, *self.v])

    def set_kv_buffer(self, layer: Any, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      *scales: Any) -> None:
        self.k[layer.layer_id][loc] = k
        self.v[layer.layer_id][loc] = v


def draft_side(me: Any, s: ops.Sizes, session: ops.Session, pool_size: int) -> Any:
    """What the append reads of a DFlash worker: the drafter (its target-hidden projection,
    layers), the fused helper, the drafter's KV pool."""
    gen = torch.Generator().manual_seed(6)
    fc = torch.randn(s.hidden, s.hidden, generator=gen).to(s.dtype)
    session.tracker.add(fc)
    layers = [types.SimpleNamespace(self_attn=types.SimpleNamespace(attn=types.SimpleNamespace(
        layer_id=i, k_scale=None, v_scale=None))) for i in range(LAYERS)]
    me.draft_model = types.SimpleNamespace(project_target_hidden=lambda h: (h @ fc).float(),
                                           layers=layers)
    me._fused_kv_helper = FusedHelper(s.hidden, session)
    me._use_fused_kv_materialize = True
    me.use_compact_draft_cache = False
    me.draft_model_runner = types.SimpleNamespace(token_to_kv_pool=Pool(pool_size, session))
    me.model_runner.device = "cpu"
    me.device = "cpu"
    me._block_pos_offsets = torch.arange(s.block)
    session.tracker.add(me._block_pos_offsets)
    return me


def append_after(me: Any, batch: Any, result: dict[str, Any]) -> Any:
    """The drafter's KV append of the verified round, as DFlash's worker calls it (a decode
    batch; the drafter shares the target's req->token table: no draft window)."""
    batch.forward_mode = types.SimpleNamespace(is_idle=lambda: False, is_extend=lambda: False)
    batch.is_extend_in_batch = False
    me.draft_model_runner.req_to_token_pool = batch.req_to_token_pool
    draft_input = types.SimpleNamespace(target_hidden=result["hidden"], ctx_lens=result["commit"],
                                        draft_seq_lens=batch.seq_lens.to(torch.int32),
                                        verified_id=result["new_id"])
    me._append_target_hidden_to_draft_kv(batch, draft_input)
    return draft_input


def count(mods: Any, session: ops.Session, path: str, s: ops.Sizes,
          weight: torch.Tensor) -> ops.Counts:
    """One round's counts (draft tail, verify, append), after one uncounted warm-up round."""
    make = ops.dflash_self if path == "dflash" else ops.ddtree_self
    size = s.bs * (s.prefix + 4 * (s.budget + 1)) + 64
    me = draft_side(make(mods, s), s, session, size)
    warm = ops.make_inputs(s, 0, weight)
    append_after(me, warm.batch, ops.run_round(me, warm, s))
    x = ops.make_inputs(s, 1, weight)
    session.counts = session.dispatch.counts = session.function.counts = ops.Counts()
    ops._device_inputs(session, x)
    split: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        before = sum(session.counts.syncs.values())
        yield
        split[name] = sum(session.counts.syncs.values()) - before

    with torch.no_grad(), session.counting():
        out = ops.run_round(me, x, s, phase, session=session)
        with phase("append"):
            append_after(me, x.batch, out)
    session.counts.split = split  # here: syncs per phase
    return session.counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", help=f"path of {ops.WHEEL}")
    ap.add_argument("--payload", type=Path, default=ops.PAYLOAD)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    session = ops.Session()
    print("| path, batch | syncs (prepare + verify + append) | by kind |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        mods = ops.load(ops.patched_package(ops.find_wheel(a.wheel), Path(tmp), a.payload),
                        session)
        for bs in a.batches:
            s = ops.Sizes(bs, vocab=2048, hidden=64)
            weight = torch.randn(s.vocab, s.hidden).to(s.dtype)
            for path in ("dflash", "ddtree"):
                c = count(mods, session, path, s, weight)
                split = " + ".join(str(c.split.get(k, 0)) for k in ("prepare", "verify",
                                                                    "append"))
                print(f"| {path}, bs {bs} | {sum(c.syncs.values())} ({split}) | "
                      f"{dict(c.syncs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
