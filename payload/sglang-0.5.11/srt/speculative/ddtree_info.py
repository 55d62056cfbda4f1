"""DDTree's verify input for SGLang 0.5.11: DFlash's verify input with a tree block.

The target pass sees ``N`` tokens per request (root + budget nodes in full-tree mode, the block in
shadow-linear mode) at positions ``start + depth`` under the ancestor-only mask. After the pass the
tree is walked; the KV slots of the accepted path are re-linked in path order (page size 1), the
rest are freed, and the target hidden states of the accepted path feed the drafter as in DFlash.

Verification is exact: a greedy request follows the target's argmax; a sampled one follows the
target's own sample at every slot (``ddtree_sampling``: temperature, top-k, top-p, min-p as the
request asks), so DDTREE's output distribution is the target's, as DFLASH's is. The one
device-to-host copy per round is the packed accepted tokens and path, which the scheduler needs on
the host anyway (as DFlash); the KV bookkeeping then uses one host-to-device copy, pinned and
non-blocking (no host wait), of the slot order and positions computed from them (no device-side
masks or sorts), and the drafter's KV append reads those positions (``draft_ctx``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import apply_custom_logit_processor
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.server_args import get_global_server_args
from sglang.srt.speculative.ddtree_sampling import sample_tokens, top_k_bounds
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.ddtree_verify import (
    RoundResult,
    TreeRound,
    block_order,
    finish_and_pack,
    tree_custom_mask,
)
from sglang.srt.speculative.ddtree_staging import committed_positions, to_device
from sglang.srt.speculative.spec_utils import assign_req_to_token_pool_func


@dataclass(frozen=True)
class DraftContext:
    """A verified round's committed tokens as the drafter's KV append needs them (on the device:
    positions and cache locations, request after request; on the host: the largest position)."""

    positions: torch.Tensor
    cache_loc: torch.Tensor
    max_position: int
    # With ``pad_draft_ctx``: the same at a fixed shape, ``bs x W`` rows (W: the walk's steps),
    # for a CUDA graph: (target hidden rows, positions, cache locations; padding: slot 0).
    padded: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None


@dataclass
class DDTreeVerifyInput(DFlashVerifyInput):
    """A DFlash verify input whose block is a DDTree (or the chain, in shadow-linear mode)."""

    tree_round: Optional[TreeRound] = None
    # ``custom_mask_index`` of the committed lengths, computed with the plan (on the device).
    mask_index: Optional[torch.Tensor] = None
    # The walk (``finish_and_pack``), or the worker's graph-replayed version of it.
    finisher: Optional[Callable[[TreeRound, torch.Tensor], Tuple[RoundResult, torch.Tensor]]] = None
    # Set by ``verify``: what the worker's draft KV append reads instead of device lengths.
    draft_ctx: Optional[DraftContext] = None
    pad_draft_ctx: bool = False  # set by the worker when its draft KV append replays a graph

    @classmethod
    def from_round(
        cls,
        plan: TreeRound,
        mask_index: Optional[torch.Tensor] = None,
        finisher: Optional[
            Callable[[TreeRound, torch.Tensor], Tuple[RoundResult, torch.Tensor]]
        ] = None,
    ) -> "DDTreeVerifyInput":
        return cls(
            draft_token=plan.inputs.input_ids.reshape(-1),
            positions=plan.inputs.positions.reshape(-1),
            draft_token_num=plan.width,
            tree_round=plan,
            mask_index=mask_index,
            finisher=finisher,
        )

    def prepare_for_verify(
        self, batch: ScheduleBatch, page_size: int, *, build_custom_mask: bool = True
    ):
        if page_size != 1:
            raise ValueError(f"DDTREE needs page_size 1, got {page_size}.")
        # Allocation and req->token links for the N block slots are DFlash's.
        super().prepare_for_verify(batch, page_size, build_custom_mask=False)
        if batch.forward_mode.is_idle() or not build_custom_mask:
            return
        assert self.tree_round is not None
        n = self.draft_token_num
        lens = batch.seq_lens_cpu  # host lengths only
        total = (int(lens.sum()) + n * int(lens.shape[0])) * n
        self.custom_mask = tree_custom_mask(
            self.tree_round.inputs.mask, lens, total, index=self.mask_index
        )

    def _apply_penalties(self, batch: ScheduleBatch, logits: torch.Tensor, bs: int) -> None:
        info = batch.sampling_info
        if info is None:
            return
        if info.has_custom_logit_processor:
            apply_custom_logit_processor(logits, info, num_tokens_in_batch=self.draft_token_num)
        if info.penalizer_orchestrator.is_required or info.logit_bias is not None:
            bias = torch.zeros((bs, logits.shape[1]), dtype=torch.float32, device=logits.device)
            info.apply_logits_bias(bias)
            logits.add_(torch.repeat_interleave(bias, self.draft_token_num, dim=0))

    def _target_tokens(self, batch: ScheduleBatch, logits: torch.Tensor, bs: int) -> torch.Tensor:
        """The target's token after every slot ``[bs, N]``: argmax, or a sample where asked."""
        n = self.draft_token_num
        info = batch.sampling_info
        if info is None or info.is_all_greedy:
            return torch.argmax(logits, dim=-1).view(bs, n)
        min_ps = info.min_ps.reshape(-1) if info.need_min_p_sampling else None
        # The largest and smallest top-k of the requests that sample, from the host.
        max_top_k, min_top_k = top_k_bounds(r.sampling_params.top_k for r in batch.reqs)
        return sample_tokens(
            logits,
            torch.repeat_interleave(info.temperatures.reshape(-1), n),
            torch.repeat_interleave(info.top_ks.reshape(-1), n),
            torch.repeat_interleave(info.top_ps.reshape(-1), n),
            None if min_ps is None else torch.repeat_interleave(min_ps, n),
            max_top_k=max_top_k,
            min_top_k=min_top_k,
            need_top_p=bool(info.need_top_p_sampling),
            # SGLang's flashinfer path filters top-k, then top-p, then min-p in turn when a
            # batch has a min-p row (sampler.py); its pytorch path, and flashinfer otherwise,
            # filter jointly. The same rows then get the same law here.
            top_p_after_top_k=bool(info.need_min_p_sampling)
            and get_global_server_args().sampling_backend == "flashinfer",
        ).view(bs, n)

    def verify(
        self,
        *,
        batch: ScheduleBatch,
        logits_output: LogitsProcessorOutput,
        page_size: int,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[int]]:
        """Tree verification (greedy or sampled); the return contract of ``DFlashVerifyInput``."""
        if batch.forward_mode.is_idle():
            empty = torch.empty((0,), dtype=torch.int64, device=batch.device)
            return empty, empty.to(torch.int32), empty, []
        assert self.tree_round is not None
        bs = batch.batch_size()
        n = self.draft_token_num
        logits = logits_output.next_token_logits
        device = logits.device
        self._apply_penalties(batch, logits, bs)
        target = self._target_tokens(batch, logits, bs)
        result, packed_dev = (self.finisher or finish_and_pack)(self.tree_round, target)

        steps = result.new_tokens.shape[1]
        # The one device-to-host copy: per request the new tokens, the accepted path's slots and
        # the accept count; everything after it on the host reads these lists.
        packed = packed_dev.cpu().tolist()
        commit_cpu: List[int] = []
        accepted_cpu: List[int] = []
        verified: List[int] = []
        think_end_id = getattr(getattr(batch, "model_config", None), "think_end_id", None)
        for i, req in enumerate(batch.reqs):
            row = packed[i]
            proposed = row[: row[2 * steps] + 1]
            appended = 0
            for token_id in proposed:
                req.output_ids.append(int(token_id))
                appended += 1
                req.check_finished()
                if req.finished():
                    break
                if req.grammar is not None:
                    req.grammar.accept_token(int(token_id))
            if appended and req.require_reasoning and think_end_id is not None:
                # counted as without speculation (SGLang 0.5.11 skips it for spec v1)
                req.update_reasoning_tokens(req.output_ids[-appended:], think_end_id)
            if req.output_ids:
                verified.append(int(req.output_ids[-1]))
            else:
                verified.append(int(req.origin_input_ids[-1]))
            commit_cpu.append(appended)
            accepted_cpu.append(max(0, appended - 1))
            req.spec_verify_ct += 1
            req.spec_accepted_drafts += accepted_cpu[-1]

        # One host-to-device copy, without a host wait (pinned, non-blocking: ddtree_staging):
        # commit lengths, the new verified ids, the block's slot order (the kept slots in path
        # order, then the freed ones: ``block_order``) and the committed tokens' positions (for
        # the drafter's KV: ``draft_ctx``).
        committed = sum(commit_cpu)
        order = block_order([row[steps : 2 * steps] for row in packed], commit_cpu, n)
        prefix_cpu = [int(x) for x in batch.seq_lens_cpu.tolist()]  # host lengths before
        positions = committed_positions(prefix_cpu, commit_cpu)
        pad: List[int] = []
        if self.pad_draft_ctx:  # per request W rows: kept slots then -1, positions then 0
            rows: List[int] = []
            at = 0
            for start, count in zip(prefix_cpu, commit_cpu, strict=True):
                rows += order[at : at + count] + [-1] * (steps - count)
                pad += [start + j for j in range(count)] + [0] * (steps - count)
                at += count
            pad = rows + pad
        staged = to_device(commit_cpu + verified + order + positions + pad, device)
        commit_lens = staged[:bs].to(torch.int32)
        new_verified_id = staged[bs : 2 * bs]
        slots = staged[2 * bs : 2 * bs + bs * n]
        tail = 2 * bs + bs * n + committed

        flat_loc = batch.out_cache_loc.view(bs * n)
        locs = flat_loc[slots]
        batch.token_to_kv_pool_allocator.free(locs[committed:])
        batch.out_cache_loc = locs[:committed]

        for req, length in zip(batch.reqs, commit_cpu, strict=True):
            req.kv_committed_len += length
            req.kv_allocated_len = req.kv_committed_len
        grown = staged[:bs].to(batch.seq_lens.dtype)
        end_offset = batch.seq_lens + grown
        assign_req_to_token_pool_func(
            batch.req_pool_indices,
            batch.req_to_token_pool.req_to_token,
            batch.seq_lens,
            end_offset,
            batch.out_cache_loc,
            bs,
        )
        batch.seq_lens.add_(grown)
        batch.seq_lens_cpu.add_(torch.tensor(commit_cpu, dtype=batch.seq_lens_cpu.dtype))
        batch.seq_lens_sum += committed

        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify requires target hidden states, but got None.")
        next_target_hidden = hidden.view(bs * n, -1)[slots[:committed]]
        logits_output.hidden_states = None
        # Where the drafter's KV of the committed tokens goes, known without a device read: the
        # kept slots' cache locations and positions, in the order of ``next_target_hidden``.
        padded = None
        if pad:
            rows_dev = staged[tail : tail + bs * steps]
            keep = rows_dev >= 0
            at = rows_dev.clamp(min=0)
            padded = (hidden.view(bs * n, -1)[at], staged[tail + bs * steps :],
                      torch.where(keep, flat_loc[at], torch.zeros_like(flat_loc[at])))
        self.draft_ctx = DraftContext(
            positions=staged[2 * bs + bs * n : tail],
            cache_loc=batch.out_cache_loc,
            max_position=max(positions, default=0),
            padded=padded,
        )
        return new_verified_id, commit_lens, next_target_hidden, accepted_cpu
