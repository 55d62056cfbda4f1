"""What a DDTree round sends from the host to the device, without a host wait (engine-agnostic).

A round reads the accepted tokens and path on the host once (the one wait the scheduler needs);
everything it then sends back (commit lengths, the verified ids, the verify block's slot order,
the positions of the committed tokens for the drafter's KV) is made on the host from those lists.
A blocking host-to-device copy (``torch.tensor(list, device=cuda)``, ``.to(cuda)`` of pageable
memory) makes torch wait for the stream (``cudaStreamSynchronize``): the host stops until every
kernel queued before it has run. :func:`to_device` copies from page-locked memory without that
wait; torch's pinned-memory allocator keeps the block until the copy has run.

Imports: torch only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def to_device(values: Sequence[int], device: torch.device | str,
              dtype: torch.dtype = torch.int64) -> Tensor:
    """``values`` as a tensor on ``device``, copied without a host wait (pinned, non-blocking)."""
    dev = torch.device(device)
    host = torch.tensor(values, dtype=dtype, pin_memory=dev.type == "cuda")
    return host.to(dev, non_blocking=True)


def committed_positions(prefix_lens: Sequence[int], commit_lens: Sequence[int]) -> list[int]:
    """The positions of a round's committed tokens, request after request: request ``b``'s
    ``commit_lens[b]`` tokens sit at ``prefix_lens[b]``, ``prefix_lens[b] + 1``, ... (its
    length before the round). The order of the kept KV slots and of their hidden states."""
    out: list[int] = []
    for start, count in zip(prefix_lens, commit_lens, strict=True):
        out.extend(range(int(start), int(start) + int(count)))
    return out
