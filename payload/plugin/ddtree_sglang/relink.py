"""Where a walked round's KV slots go (torch only, no host reads).

The verify block's ``n`` slots of a request sit at rows ``prefix .. prefix + n - 1`` of its
req->token row (slots reserved for it by SGLang). After the walk, the accepted path's slots must
sit at rows ``prefix .. prefix + accepted`` in path order, so that the committed sequence's KV is
contiguous, as SGLang's attention reads it. :func:`path_first_order` gives the permutation of the
``n`` slots that does it: the path's slots first, in path order, then every other slot of the
round in slot order (they stay reserved for the request; the next round overwrites them).
"""

from __future__ import annotations

import torch
from torch import Tensor


def path_first_order(keep_slots: Tensor, accepted: Tensor, n: int) -> Tensor:
    """``[bs, n]`` int64 permutation of each request's verify slots, the path first.

    ``keep_slots [bs, D + 1]``: the walk's path (verify-block slots, root first, -1 pad);
    ``accepted [bs]``: accepted draft tokens (the path's first ``accepted + 1`` slots are kept).
    """
    bs, steps = keep_slots.shape
    device = keep_slots.device
    along = torch.arange(steps, device=device, dtype=torch.int64).view(1, steps)
    live = (along <= accepted.to(torch.int64).view(bs, 1)) & (keep_slots >= 0)
    # Rank of each slot: its place on the path if kept, else n + slot; one spare column takes
    # the writes of the path's unused positions.
    rank = torch.arange(n, device=device, dtype=torch.int64).view(1, n).expand(bs, n) + n
    rank = torch.cat([rank, rank.new_zeros(bs, 1)], 1)
    column = torch.where(live, keep_slots.to(torch.int64), n)
    rank.scatter_(1, column, along.expand(bs, steps).contiguous())
    return torch.argsort(rank[:, :n], dim=1, stable=True)
