"""The DDTREE worker for SGLang 0.5.17+: DFLASH's V2 worker with a tree verifier.

Prefill and idle batches are DFLASH's own (``DFlashWorkerV2.forward_batch_generation``). A decode
round is this module's:

1. **Draft.** DFLASH's drafter runs its block (the previous bonus token, then mask tokens) over
   the request's reserved KV slots, as DFLASH does; its per-depth hidden states go through the
   target's LM head to the per-depth top-k (``ddtree.vocab``), not to a greedy chain (the draft
   sampler DFLASH folds into its graph is therefore not built).
2. **Plan.** The DDTree core builds the tree (``budget`` best nodes by path probability; the
   drafter's top-1 chain in shadow-linear mode) and compiles its verify inputs: tokens, positions
   ``prefix + depth`` and the ancestor-only mask. Plan and walk replay from CUDA graphs per batch
   size (``ddtree.graphs``; module docstring of the 0.5.11 worker for the limits).
3. **Verify.** The target runs the ``budget + 1`` slots under the tree's mask (SGLang's flattened
   custom-mask layout, the triton backend; by default through the tree kernel and replayed from
   the target's CUDA graphs, which carry the mask; switched off, eagerly through SGLang's extend
   kernel: ``target_attention``) into the request's reserved KV slots
   ``prefix .. prefix + budget``; the target's token after every slot is its argmax for greedy
   requests and its own filtered sample for sampled ones (``ddtree.sampling``), so the walk
   commits exactly what the target alone would.
4. **Keep.** The accepted path's slots are re-linked to the rows ``prefix .. prefix + accepted``
   of the request's req->token row (a permutation of the row's own reserved slots: nothing is
   allocated or freed), and the target's hidden states of the path feed the drafter's KV as in
   DFLASH.

The scheduler then reads the round as a DFLASH round: ``next_token_ids`` (stride = the drafter's
block: the accepted drafts, then the bonus), ``accept_lens`` (accepted + 1) and ``new_seq_lens``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from ddtree.core import draft_topk
from ddtree.graphs import GraphCache
from ddtree.sampling import sample_tokens, top_k_bounds
from ddtree.vocab import head_topk
from sglang.srt.distributed import get_tp_group
from sglang.srt.speculative import dflash_worker_v2 as _v2
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from ddtree_sglang import compat, target_attention
from ddtree_sglang.relink import path_first_order
from ddtree_sglang.settings import from_env
from ddtree_sglang.verify import (
    TreeRound,
    custom_mask_index,
    finish_and_pack,
    plan_round,
    tree_custom_mask,
)

# What DFLASH's own worker uses, taken from its module so that a release that moved one of them
# still gives the worker the one its DFLASH uses (tests/test_plugin_releases.py checks each
# supported release's module binds them).
CaptureHiddenMode = _v2.CaptureHiddenMode
DFlashVerifyInput = _v2.DFlashVerifyInput
ForwardBatch = _v2.ForwardBatch
ForwardMode = _v2.ForwardMode
GenerationBatchResult = _v2.GenerationBatchResult
SpeculativeAlgorithm = _v2.SpeculativeAlgorithm
apply_dflash_verify_logits_adjustments = _v2.apply_dflash_verify_logits_adjustments

logger = logging.getLogger(__name__)


class DDTreeWorker(DFlashWorkerV2):
    """DFLASH's V2 worker whose decode round verifies a DDTree (non-overlap, page size 1)."""

    def __init__(self, server_args: Any, *args: Any, **kwargs: Any) -> None:
        # The constructor's parameters differ by release (compat.check_worker_ctor): forwarded.
        settings = from_env(os.environ)
        self.ddtree_budget = settings.budget
        self.ddtree_topk = settings.topk
        self.ddtree_shadow_linear = settings.shadow_linear
        self.ddtree_settings = settings
        block = int(server_args.speculative_dflash_block_size)
        drafter_args = compat.draft_args(server_args, block)
        with compat.published(drafter_args):
            super().__init__(drafter_args, *args, **kwargs)
        if int(self.block_size) != block:
            raise RuntimeError(f"DDTREE: drafter block {self.block_size}, expected {block}.")
        self.verify_width = block if self.ddtree_shadow_linear else self.ddtree_budget + 1
        self._verify_graphed = False  # init_attention_backends: the verify graphs take the mask
        self._verify_graphs_warned = False
        if self._need_mamba_verify_commit and not self.ddtree_shadow_linear:
            raise RuntimeError("DDTREE full-tree verification does not support hybrid (mamba) "
                               "targets; set SGLANG_DDTREE_SHADOW_LINEAR=1 or use DFLASH.")
        self._check_target()
        self._plan_graphs, self._walk_graphs = self._round_graphs(server_args)
        if int(get_tp_group().rank_in_group) == 0:
            logger.info("DDTREE ready (ddtree-sglang-plugin): budget=%d topk=%d block=%d "
                        "width=%d mode=%s round_graphs=%s", self.ddtree_budget,
                        self.ddtree_topk, block, self.verify_width, settings.mode,
                        "on" if self._plan_graphs.enabled else "off")

    def init_attention_backends(self) -> None:
        """DFLASH's, then the target's verify attention (``target_attention``: the tree kernel
        and verify graphs that carry the tree's mask), before any graph is captured."""
        super().init_attention_backends()
        self._verify_graphed = target_attention.prepare(
            self.target_worker.model_runner, tree_mode=not self.ddtree_shadow_linear,
            n=self.verify_width, tp_size=int(get_tp_group().world_size),
            graphs_on=not bool(getattr(self.server_args, "disable_cuda_graph", False)),
            tree_attention=self.ddtree_settings.tree_attention,
            verify_graph=self.ddtree_settings.verify_graph)

    def _graphs_hold_mask(self) -> bool:
        """Every full-tree verify: the target's graphs (a recapture included) were captured on
        the changed backend (``target_attention.graphs_hold_mask``); else this verify runs
        eagerly (said once)."""
        why = target_attention.graphs_hold_mask(self.target_worker.model_runner)
        if why is not None and not self._verify_graphs_warned:
            self._verify_graphs_warned = True
            logger.warning("DDTREE target verify: eager (%s).", why)
        return why is None

    def _check_target(self) -> None:
        try:
            from ddtree.admission import check_target
        except ImportError:  # a core without the admission module
            return
        runner = self.model_runner
        why = check_target(str(runner.model_config.model_path),
                           getattr(runner, "sliding_window_size", None),
                           shadow_linear=self.ddtree_shadow_linear)
        if why:
            raise RuntimeError(why.replace("--speculative-ddtree-shadow-linear",
                                           "SGLANG_DDTREE_SHADOW_LINEAR=1"))

    def _maybe_build_draft_sampler(self) -> None:
        # DFLASH folds a greedy argmax over the drafter's block into its draft graph; DDTREE
        # needs the drafter's hidden states (for the per-depth top-k), so no sampler.
        return None

    def _round_graphs(self, server_args: Any) -> tuple[GraphCache, GraphCache]:
        limits = [int(os.environ.get("SGLANG_DDTREE_ROUND_GRAPHS_MAX_BS", "") or 32)]
        for value in (compat.graph_max_bs(server_args),
                      getattr(server_args, "max_running_requests", None)):
            if value:
                limits.append(int(value))
        max_bs = max(0, min(limits))
        enabled = (not bool(getattr(server_args, "disable_cuda_graph", False))
                   and int(get_tp_group().world_size) == 1 and max_bs > 0
                   and os.environ.get("SGLANG_DDTREE_ROUND_GRAPHS", "1") not in ("", "0"))
        caches: list[GraphCache] = []

        def off(why: str) -> None:  # one failure turns both off (the walk reads the plan's)
            for cache in caches:
                cache.disable(why)
            logger.warning("DDTREE round graphs off (%s): the round runs eagerly.", why)

        def captured(what: str) -> Any:
            return lambda bs: logger.info("DDTREE round graph captured: %s bs=%s", what, bs)

        for fn, what in ((self._plan, "plan"), (finish_and_pack, "walk")):
            caches.append(GraphCache(fn, enabled=enabled, max_entries=max(1, max_bs),
                                     on_fail=off, capture_if=lambda bs: int(bs) <= max_bs,
                                     on_capture=captured(what)))
        return caches[0], caches[1]

    def _plan(self, hidden: torch.Tensor, roots: torch.Tensor, starts: torch.Tensor,
              lm_head: Any) -> tuple[TreeRound, torch.Tensor | None]:
        top_logprobs, top_tokens = self._draft_topk(hidden, lm_head)
        plan = plan_round(top_logprobs, top_tokens, roots, starts, budget=self.ddtree_budget,
                          shadow_linear=self.ddtree_shadow_linear, score_chain=False)
        capturing = starts.is_cuda and torch.cuda.is_current_stream_capturing()
        return plan, (custom_mask_index(starts, plan.width) if capturing else None)

    def _draft_topk(self, hidden: torch.Tensor, lm_head: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden [bs, D, H]`` -> per-depth top-k log-probs and ids over the target's head."""
        return head_topk(hidden, lm_head, self.ddtree_topk, get_tp_group(), draft_topk)

    # -- one decode round --------------------------------------------------------------------

    def forward_batch_generation(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or (
            batch.forward_mode.is_idle()
        ):
            return super().forward_batch_generation(batch, *args, **kwargs)
        if getattr(batch, "has_grammar", False):
            raise RuntimeError("DDTREE does not serve grammar-constrained requests (refused at "
                               "admission); a batch holding one reached the worker.")
        on_publish = kwargs.get("on_publish", args[0] if args else None)
        return self._tree_round(batch, on_publish)

    def _host_lens(self, batch: Any, draft_input: Any, prefix: torch.Tensor) -> torch.Tensor:
        """The committed lengths on the host (no device read where the scheduler keeps them)."""
        if batch.seq_lens_cpu is not None:
            return batch.seq_lens_cpu.to(torch.int64)
        return prefix.to("cpu", dtype=torch.int64)

    def _draft(self, batch: Any, bonus: torch.Tensor, prefix: torch.Tensor,
               host_lens: torch.Tensor, embed: Any) -> torch.Tensor:
        """The drafter's block over the request's next slots -> hidden states ``[bs, block, H]``."""
        bs, block = int(prefix.shape[0]), int(self.block_size)
        rows = batch.req_pool_indices.to(torch.int64).view(bs, 1)
        positions = prefix.to(torch.int64).view(bs, 1) + torch.arange(block, device=self.device)
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        locs = req_to_token[rows, positions].to(torch.int64)
        ids = torch.full((bs, block), int(self._mask_token_id), dtype=torch.int64,
                         device=self.device)
        ids[:, 0] = bonus
        embeds = embed(ids)
        bound = (host_lens + block).to(torch.int32)
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=ids.reshape(-1),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix,
            out_cache_loc=locs.reshape(-1),
            seq_lens_sum=int(bound.sum()),
            seq_lens_cpu=bound,
            positions=positions.reshape(-1),
            input_embeds=embeds.reshape(bs * block, -1),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        with torch.inference_mode():
            out = self.draft_model_runner.forward(forward_batch)
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the DFLASH drafter returned no hidden states.")
        return hidden.view(bs, block, -1)

    def _target_tokens(self, batch: Any, logits: torch.Tensor, bs: int, n: int) -> torch.Tensor:
        """The target's token after every slot ``[bs, n]``: argmax, or its sample where asked
        (the same law as the 0.5.11 patch set's ``DDTreeVerifyInput._target_tokens``)."""
        info = batch.sampling_info
        if info is None or info.is_all_greedy:
            return torch.argmax(logits, dim=-1).view(bs, n)
        min_ps = info.min_ps.reshape(-1) if info.need_min_p_sampling else None
        max_top_k, min_top_k = top_k_bounds(r.sampling_params.top_k for r in batch.reqs)

        def rows(t: torch.Tensor) -> torch.Tensor:
            return torch.repeat_interleave(t.reshape(-1), n)

        backend = getattr(self.server_args, "sampling_backend", None)
        return sample_tokens(
            logits, rows(info.temperatures), rows(info.top_ks), rows(info.top_ps),
            None if min_ps is None else rows(min_ps),
            max_top_k=max_top_k, min_top_k=min_top_k, need_top_p=bool(info.need_top_p_sampling),
            # SGLang's flashinfer sampler filters top-k, then top-p, then min-p in turn when a
            # batch has a min-p row; its pytorch path filters jointly (sampler.py).
            top_p_after_top_k=bool(info.need_min_p_sampling) and backend == "flashinfer",
        ).view(bs, n)

    def _verify(self, batch: Any, plan: TreeRound, mask_index: torch.Tensor | None,
                prefix: torch.Tensor, host_lens: torch.Tensor) -> tuple[Any, torch.Tensor, bool]:
        """The target over the tree's slots; returns its output, the slots' KV locations
        ``[bs, n]`` and whether a CUDA graph ran."""
        bs, n = int(prefix.shape[0]), plan.width
        rows = batch.req_pool_indices.to(torch.int64).view(bs, 1)
        slots = prefix.to(torch.int64).view(bs, 1) + torch.arange(n, device=self.device)
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        locs = req_to_token[rows, slots].to(torch.int64)
        mask = None
        if not self.ddtree_shadow_linear:
            total = (int(host_lens.sum()) + n * bs) * n
            mask = tree_custom_mask(plan.inputs.mask, host_lens, total, index=mask_index)
        verify_input = DFlashVerifyInput(
            draft_token=plan.inputs.input_ids.reshape(-1),
            positions=plan.inputs.positions.reshape(-1),
            draft_token_num=n,
            custom_mask=mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        batch.out_cache_loc = locs.reshape(-1)
        saved = batch.seq_lens_cpu, batch.seq_lens_sum
        bound = host_lens + n
        batch.seq_lens_cpu = bound.to(saved[0].dtype if saved[0] is not None else torch.int64)
        batch.seq_lens_sum = int(bound.sum())
        try:
            eager = mask is not None and not (self._verify_graphed and self._graphs_hold_mask())
            with compat.eager(self.target_worker.model_runner, on=eager):
                forward_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
                out = self.target_worker.forward_batch_generation(
                    batch=None, forward_batch=forward_batch, is_verify=True,
                    skip_attn_backend_init=True)
        finally:
            batch.seq_lens_cpu, batch.seq_lens_sum = saved
        return out, locs, bool(out.can_run_cuda_graph)

    def _tree_round(self, batch: Any, on_publish: Any) -> Any:
        draft_input = batch.spec_info
        bs, block = len(batch.seq_lens), int(self.block_size)
        prefix = batch.seq_lens
        host_lens = self._host_lens(batch, draft_input, prefix)
        target_model = self.target_worker.model_runner.model
        lm_head = target_model.lm_head
        bonus = draft_input.bonus_tokens.view(-1).to(torch.int64)
        hidden = self._draft(batch, bonus, prefix, host_lens, target_model.get_input_embeddings())
        starts = prefix.to(torch.int64)  # positions prefix + depth are int64 (core.VerifyInputs)
        plan, mask_index = self._plan_graphs(bs, hidden[:, 1:, :], bonus, starts, lm_head)
        out, locs, graphed = self._verify(batch, plan, mask_index, prefix, host_lens)
        n = plan.width
        logits_output = out.logits_output
        logits = logits_output.next_token_logits
        if batch.sampling_info is not None:
            apply_dflash_verify_logits_adjustments(
                next_token_logits=logits, sampling_info=batch.sampling_info, draft_token_num=n)
        target = self._target_tokens(batch, logits, bs, n)
        if self._plan_graphs.holds(bs, plan):
            result, _ = self._walk_graphs(bs, plan, target)
        else:
            result, _ = finish_and_pack(plan, target)
        accepted = result.walk.num_accepted.to(torch.int64)  # [bs]
        new_tokens = result.new_tokens  # [bs, block]: accepted drafts, the bonus, -1 pad
        if int(new_tokens.shape[1]) != block:
            raise RuntimeError(f"DDTREE: a round of {new_tokens.shape[1]} tokens, block {block}.")
        commit = (accepted + 1).to(torch.int32)
        bonus_next = new_tokens.gather(1, accepted.view(bs, 1)).view(bs)
        out_tokens = new_tokens.clamp_min(0)
        new_seq_lens = prefix + commit.to(prefix.dtype)
        perm = self._relink(batch, result.keep_slots, accepted, locs, prefix, n)
        if on_publish is not None:
            on_publish(new_seq_lens)
        hidden_t = logits_output.hidden_states
        if hidden_t is None:
            raise RuntimeError("DDTREE verify needs the target's hidden states, got None.")
        hidden_t = hidden_t.view(bs, n, -1)
        kept = perm[:, :block]
        path_hidden = hidden_t.gather(1, kept.unsqueeze(2).expand(-1, -1, hidden_t.shape[2]))
        path_locs = locs.gather(1, kept)
        positions = prefix.to(torch.int64).view(bs, 1) + torch.arange(block, device=self.device)
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=path_hidden.reshape(bs * block, -1),
            cache_loc=path_locs.reshape(-1),
            positions=positions.reshape(-1),
            cache_loc_2d=path_locs,
            commit_lens=commit,
        )
        logits_output.hidden_states = None
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=out_tokens.reshape(-1),
            accept_lens=commit,
            can_run_cuda_graph=graphed,
            next_draft_input=self._make_next_draft_input_decode(
                bonus_tokens=bonus_next, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=block,
            new_seq_lens=new_seq_lens,
        )

    def _relink(self, batch: Any, keep_slots: torch.Tensor, accepted: torch.Tensor,
                locs: torch.Tensor, prefix: torch.Tensor, n: int) -> torch.Tensor:
        """Put the accepted path's KV slots at rows ``prefix ..`` of each request's req->token
        row (``relink.path_first_order``); returns the permutation ``[bs, n]``."""
        perm = path_first_order(keep_slots, accepted, n)
        if self.ddtree_shadow_linear:
            return perm  # the chain's path is its first slots: nothing moves
        bs = int(keep_slots.shape[0])
        rows = batch.req_pool_indices.to(torch.int64).view(bs, 1)
        slots = prefix.to(torch.int64).view(bs, 1) + torch.arange(n, device=self.device)
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        req_to_token[rows, slots] = locs.gather(1, perm).to(req_to_token.dtype)
        return perm
