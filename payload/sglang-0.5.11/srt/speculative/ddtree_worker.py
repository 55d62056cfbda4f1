"""DDTree speculative decoding worker for SGLang 0.5.11: DFlash's worker with a tree verifier.

Everything DFlash does (drafter set-up, hidden-state capture, draft KV upkeep, prefill) is
inherited. The one change is after the draft pass: instead of the drafter's greedy chain, the
per-depth top-k of the drafter's distribution goes through the DDTree core (``ddtree_verify``), and
the target verifies the resulting tree (full-tree mode) or the chain with the tree scored beside it
(shadow-linear mode). ``dflash_worker.py`` calls :meth:`DDTreeWorker.ddtree_prepare_verify` through
a three-line hook; see ``ddtree_args`` for the server flags and constraints.

The round's fixed-shape work is replayed from CUDA graphs, one per batch size (``ddtree_graphs``):
the plan (the drafter's head and top-k, build, compile and the mask's placement) and the walk,
captured the first time a batch size is seen. Eager instead where SGLang's CUDA graphs are off
(``--disable-cuda-graph``), with tensor parallelism (the top-k's all-gathers), with
``SGLANG_DDTREE_ROUND_GRAPHS=0``, and for batches larger than the least of
``--cuda-graph-max-bs``, ``--max-running-requests`` and ``SGLANG_DDTREE_ROUND_GRAPHS_MAX_BS``
(default 32: the host's launch cost matters at small batches, and each batch size's graph keeps
its own input buffers, about ``bs x (block - 1) x hidden x 2`` bytes, 120 KiB a request at hidden
4096). The results are the same either way.
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch

from sglang.srt.distributed import get_tp_group
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.ddtree_admission import check_target
from sglang.srt.speculative.ddtree_args import DEFAULT_BUDGET, ddtree_draft_block_size
from sglang.srt.speculative.ddtree_core import draft_topk
from sglang.srt.speculative.ddtree_graphs import GraphCache
from sglang.srt.speculative.ddtree_info import DDTreeVerifyInput
from sglang.srt.speculative.ddtree_verify import (
    RoundResult,
    TreeRound,
    custom_mask_index,
    finish_and_pack,
    plan_round,
)
from sglang.srt.speculative.ddtree_vocab import head_topk
from sglang.srt.speculative.dflash_utils import resolve_dflash_verify_mask_policy
from sglang.srt.speculative.dflash_worker import DFlashWorker

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class _RopeTable:
    """The drafter's RoPE table as a graph's bound argument (by identity)."""

    cos_sin: torch.Tensor


class DDTreeWorker(DFlashWorker):
    """DFlash worker whose verify block is a DDTree (spec-v1, page size 1, exact verify)."""

    def __init__(self, server_args: ServerArgs, *args: Any, **kwargs: Any) -> None:
        self.ddtree_budget = int(server_args.speculative_ddtree_budget or DEFAULT_BUDGET)
        self.ddtree_topk = int(server_args.speculative_ddtree_topk or self.ddtree_budget)
        self.ddtree_shadow_linear = bool(server_args.speculative_ddtree_shadow_linear)
        # The drafter runs DFlash's block; the target verifies budget + 1 slots (ServerArgs).
        draft_args = copy.copy(server_args)
        draft_args.speculative_num_draft_tokens = ddtree_draft_block_size(server_args)
        super().__init__(draft_args, *args, **kwargs)
        self.server_args = server_args
        # The draft-expected accepts of the tree and of DFlash's chain, summed each round
        # (``ddtree_stats``): a diagnostic that builds and scores the chain too and costs kernels
        # every round, so only when asked, and in shadow-linear mode (which exists to score).
        self.ddtree_score_chain = self.ddtree_shadow_linear or os.environ.get(
            "SGLANG_DDTREE_SCORE_CHAIN", ""
        ) not in ("", "0")
        self._rounds = 0
        self._tree_expected: Optional[torch.Tensor] = None
        self._chain_expected: Optional[torch.Tensor] = None
        self._plan_graphs, self._walk_graphs = self._round_graphs(server_args)
        self._kv_graphs = self._kv_graph_cache()
        backend = self.target_worker.model_runner.attn_backend
        if not self.ddtree_shadow_linear and hasattr(
            backend, "update_mamba_state_after_mtp_verify"
        ):
            raise RuntimeError(
                "DDTREE full-tree verification does not support hybrid (mamba) targets; "
                "use --speculative-ddtree-shadow-linear or --speculative-algorithm DFLASH."
            )
        # The window SGLang's attention applies (ModelRunner.sliding_window_size), never a
        # config.json key (Qwen2.5/Qwen3 carry an unused one).
        why = check_target(
            str(server_args.model_path),
            getattr(self.target_worker.model_runner, "sliding_window_size", None),
            shadow_linear=self.ddtree_shadow_linear,
        )
        if why is not None:
            raise RuntimeError(why)
        if self.tp_rank == 0:
            logger.info(
                "DDTREE ready: budget=%d topk=%d block=%d mode=%s round_graphs=%s",
                self.ddtree_budget,
                self.ddtree_topk,
                self.block_size,
                "shadow-linear" if self.ddtree_shadow_linear else "full-tree",
                "on" if self._plan_graphs.enabled else "off",
            )

    def _round_graphs(self, server_args: ServerArgs) -> Tuple[GraphCache, GraphCache]:
        """Graph caches for the round's plan and walk, keyed by batch size (module docstring)."""
        limits = [int(getattr(server_args, "cuda_graph_max_bs", 0) or 0),
                  int(os.environ.get("SGLANG_DDTREE_ROUND_GRAPHS_MAX_BS", "") or 32)]
        running = getattr(server_args, "max_running_requests", None)
        if running:
            limits.append(int(running))
        max_bs = max(0, min(limits))
        enabled = (
            not bool(getattr(server_args, "disable_cuda_graph", False))
            and int(get_tp_group().world_size) == 1
            and max_bs > 0
            and os.environ.get("SGLANG_DDTREE_ROUND_GRAPHS", "1") not in ("", "0")
        )
        caches: list = []

        def off(why: str) -> None:  # one failure turns both off (the walk reads the plan's)
            for cache in caches:
                cache.disable(why)
            logger.warning("DDTREE round graphs off (%s): the round runs eagerly.", why)

        def small(bs: Any) -> bool:  # each batch size's graph keeps its buffers
            return int(bs) <= max_bs

        def captured(what: str) -> Any:
            return lambda bs: logger.info("DDTREE round graph captured: %s bs=%s", what, bs)

        for fn, what in ((self._plan, "plan"), (finish_and_pack, "walk")):
            caches.append(GraphCache(fn, enabled=enabled, max_entries=max(1, max_bs),
                                     on_fail=off, capture_if=small, on_capture=captured(what)))
        return caches[0], caches[1]

    def _plan(
        self, hidden: torch.Tensor, roots: torch.Tensor, starts: torch.Tensor, lm_head: Any
    ) -> Tuple[TreeRound, Optional[torch.Tensor]]:
        """The round's plan and where its mask goes in SGLang's flattened mask (no host reads)."""
        top_logprobs, top_tokens = self._draft_topk(hidden, lm_head)
        plan = plan_round(
            top_logprobs,
            top_tokens,
            roots,
            starts,
            budget=self.ddtree_budget,
            shadow_linear=self.ddtree_shadow_linear,
            score_chain=self.ddtree_score_chain,
        )
        # The mask's placement: free inside a graph; eager, the host computes it (ddtree_info).
        capturing = starts.is_cuda and torch.cuda.is_current_stream_capturing()
        index = custom_mask_index(starts, plan.width) if capturing else None
        return plan, index

    def _finish(self, plan: TreeRound, target: torch.Tensor) -> Tuple[RoundResult, torch.Tensor]:
        """The walk, from the graph of this batch size where the plan came from one."""
        bs = int(target.shape[0])
        if self._plan_graphs.holds(bs, plan):
            return self._walk_graphs(bs, plan, target)
        return finish_and_pack(plan, target)

    def _draft_topk(self, hidden: torch.Tensor, lm_head: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-depth top-k log-probs of the drafter over the (vocab-parallel) target head
        (``ddtree_vocab.head_topk``, shared with the plugin form)."""
        return head_topk(hidden, lm_head, self.ddtree_topk, get_tp_group(), draft_topk)

    def ddtree_prepare_verify(
        self,
        batch: ScheduleBatch,
        block_ids: torch.Tensor,
        draft_hidden: torch.Tensor,
        lm_head: Any,
    ) -> None:
        """Called by DFlash's draft step after the draft pass: plan the tree, stage the verify."""
        bs = int(block_ids.shape[0])
        plan, mask_index = self._plan_graphs(
            bs, draft_hidden[:, 1:, :], block_ids[:, 0], batch.seq_lens, lm_head
        )
        verify_input = DDTreeVerifyInput.from_round(plan, mask_index, self._finish)
        kv_graphs = getattr(self, "_kv_graphs", None)
        verify_input.pad_draft_ctx = bool(
            kv_graphs is not None and kv_graphs.enabled and self._fused_on()
            and not self.use_compact_draft_cache and kv_graphs._capture_if(bs))
        _, build_custom_mask = resolve_dflash_verify_mask_policy(self.model_runner.attn_backend)
        if not build_custom_mask and not self.ddtree_shadow_linear:
            raise RuntimeError(
                "DDTREE full-tree verification needs an attention backend that takes a custom "
                "mask (triton); use --attention-backend triton or --speculative-ddtree-shadow-linear."
            )
        verify_input.prepare_for_verify(batch, self.page_size, build_custom_mask=build_custom_mask)
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.spec_info = verify_input
        batch.return_hidden_states = False
        self._record(plan)

    def _record(self, plan: TreeRound) -> None:
        self._rounds += int(plan.tree.tokens.shape[0])
        if not self.ddtree_score_chain:
            return
        tree = plan.expected_accept.sum()
        if self._tree_expected is None:
            self._tree_expected = tree
        else:
            self._tree_expected.add_(tree)
        if plan.chain_expected_accept is not None:
            chain = plan.chain_expected_accept.sum()
            if self._chain_expected is None:
                self._chain_expected = chain
            else:
                self._chain_expected.add_(chain)

    # --- the drafter's side of a round, without host reads of device values ------------------

    def ddtree_draft_lens_cpu(self, batch: ScheduleBatch) -> Optional[torch.Tensor]:
        """The drafter's prefix lengths on the host, for DFlash's draft forward (its patched
        ``_prepare_for_speculative_decoding`` asks here instead of copying them from the device
        and summing them there: two host waits a round). Without a draft window they are the
        committed lengths, which the batch keeps on the host; with one, None (DFlash's way)."""
        if self.use_compact_draft_cache:
            return None
        return batch.seq_lens_cpu

    def _append_target_hidden_to_draft_kv(self, batch: ScheduleBatch, draft_input: Any) -> None:
        """After a verify: the committed tokens' KV into the drafter's cache from the positions
        and cache locations the verify staged (``DraftContext``), with no host read. DFlash's
        own (prefill, a draft window, anything else) gathers them on the device, which costs
        host waits at batch > 1 (boolean-mask indexing) and in its fused path (``max().item()``).
        """
        spec = batch.spec_info
        ctx = getattr(spec, "draft_ctx", None)
        hidden = draft_input.target_hidden
        if ctx is None or self.use_compact_draft_cache or hidden is None \
                or int(hidden.shape[0]) != int(ctx.cache_loc.shape[0]):
            return super()._append_target_hidden_to_draft_kv(batch, draft_input)
        spec.draft_ctx = None
        with torch.inference_mode():
            if ctx.padded is not None and self._fused_on():
                # fixed shape: replayed from this batch size's graph (eager where it cannot)
                holder = self._rope_holder(self._rope_cache(ctx.max_position, hidden.device))
                self._kv_graphs(int(batch.batch_size()), *ctx.padded, holder)
                ctx_hidden = None
            else:
                ctx_hidden = self.draft_model.project_target_hidden(hidden)
            if ctx_hidden is None:
                pass
            elif self._use_fused_kv_materialize and self._fused_kv_helper is not None:
                try:
                    self._materialize_fused(ctx_hidden, ctx.positions, ctx.cache_loc,
                                            ctx.max_position)
                except Exception as exc:  # as DFlash does: the sequential path from now on
                    logger.warning("DDTREE fused KV append failed; sequential from now: %s", exc)
                    self._use_fused_kv_materialize = False
                    self._fused_kv_helper = None
                    self._append_target_hidden_sequential(ctx_hidden, ctx.positions,
                                                          ctx.cache_loc)
            else:
                self._append_target_hidden_sequential(ctx_hidden, ctx.positions, ctx.cache_loc)
        draft_input.draft_seq_lens = batch.seq_lens.to(dtype=torch.int32)
        draft_input.ctx_lens = torch.zeros_like(draft_input.ctx_lens)
        draft_input.target_hidden = hidden[:0]

    def _fused_on(self) -> bool:
        return bool(getattr(self, "_use_fused_kv_materialize", False)) \
            and getattr(self, "_fused_kv_helper", None) is not None

    def _kv_graph_cache(self) -> GraphCache:
        """The draft KV append at a fixed shape, one graph per batch size (as the plan's)."""
        plans = self._plan_graphs

        def off(why: str) -> None:
            logger.warning("DDTREE draft KV graph off (%s): the append runs eagerly.", why)

        return GraphCache(self._kv_fixed, enabled=plans.enabled, max_entries=plans.max_entries,
                          capture_if=plans._capture_if, on_fail=off,
                          on_capture=lambda bs: logger.info(
                              "DDTREE round graph captured: draft-kv bs=%s", bs))

    def _kv_fixed(self, hidden: torch.Tensor, positions: torch.Tensor, cache_loc: torch.Tensor,
                  holder: Any) -> None:
        """Project the target's hidden rows and write their K and V (padding rows: slot 0)."""
        ctx_hidden = self.draft_model.project_target_hidden(hidden)
        self._write_kv(ctx_hidden, positions, cache_loc, holder.cos_sin)

    def _rope_holder(self, cos_sin: torch.Tensor) -> Any:
        """One object per RoPE table (a graph binds it by identity: a new table, eager)."""
        held = getattr(self, "_rope_held", None)
        if held is None or held.cos_sin is not cos_sin:
            held = self._rope_held = _RopeTable(cos_sin)
        return held

    def _rope_cache(self, max_position: int, device: torch.device) -> torch.Tensor:
        """The drafter's RoPE table, long enough for ``max_position`` (known on the host)."""
        helper: Any = self._fused_kv_helper
        ensure = getattr(helper.rotary_emb, "_ensure_cos_sin_cache_length", None)
        if callable(ensure):
            ensure(max_position)
        cos_sin = helper.rotary_emb.cos_sin_cache
        if max_position >= int(cos_sin.shape[0]):
            raise RuntimeError(f"RoPE cache too short: position {max_position}, "
                               f"cache {int(cos_sin.shape[0])}")
        return cos_sin if cos_sin.device == device else cos_sin.to(device)

    def _materialize_fused(self, ctx_hidden: torch.Tensor, positions: torch.Tensor,
                           cache_loc: torch.Tensor, max_position: int) -> None:
        """DFlash's fused KV materialisation (one batched projection, then RMSNorm + RoPE and the
        pool's write per layer) with the largest position from the host, not the device."""
        self._write_kv(ctx_hidden, positions, cache_loc,
                       self._rope_cache(max_position, ctx_hidden.device))

    def _write_kv(self, ctx_hidden: torch.Tensor, positions: torch.Tensor,
                  cache_loc: torch.Tensor, cos_sin: torch.Tensor) -> None:
        from sglang.srt.speculative.triton_ops.fused_kv_materialize import _fused_norm_rope

        helper: Any = self._fused_kv_helper
        kv_all = torch.einsum("th,loh->lto", ctx_hidden, helper.batched_kv_weight)
        pool = self.draft_model_runner.token_to_kv_pool
        for layer_id in range(helper.n_layers):
            k, v = _fused_norm_rope(kv_all[layer_id], helper.k_norm_weights[layer_id], cos_sin,
                                    positions, helper.num_kv_heads, helper.head_dim,
                                    helper.rotary_dim, helper.eps_values[layer_id])
            attn = self.draft_model.layers[layer_id].self_attn.attn
            pool.set_kv_buffer(attn, cache_loc, k, v, attn.k_scale, attn.v_scale)

    def ddtree_stats(self) -> Dict[str, float]:
        """Draft-expected accepted tokens per request-round, tree vs chain (syncs; not hot path).

        Recorded in shadow-linear mode or with SGLANG_DDTREE_SCORE_CHAIN set; otherwise the
        expectations are 0 (the round count is kept)."""
        if not self._rounds or self._tree_expected is None:
            return {"rounds": float(self._rounds), "tree_expected_accept": 0.0,
                    "chain_expected_accept": 0.0}
        chain = self._chain_expected
        return {
            "rounds": float(self._rounds),
            "tree_expected_accept": float(self._tree_expected) / self._rounds,
            "chain_expected_accept": float("nan") if chain is None else float(chain) / self._rounds,
        }
