"""Time (and so fill the caches of) the kernels DFLASH's sampled verify runs on first use.

    python -m rehearsal.prewarm OUT.json

Runs 2 and 3 saw DFLASH's first sampled request stall ~89 s after its first token (the log shows
the request finishing then: a one-time cost, not a hang). SGLang 0.5.11's DFLASH sampled verify
(``speculative/dflash_utils.py``) calls sgl-kernel's ``top_k_renorm_prob``, ``top_p_renorm_prob``
and ``tree_speculative_sampling_target_only``; this script calls each once on small tensors, in
the servers' environment (same HOME, so the same JIT and driver caches), and records how long the
first and the second call of each took. A first call far slower than the second is the stall.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def _timed(fn: Any) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for name in ("first_s", "second_s"):
        t0 = time.monotonic()
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as exc:  # recorded: the next kernel still gets its try
            out["error"] = f"{type(exc).__name__}: {exc}"[:500]
            break
        out[name] = round(time.monotonic() - t0, 3)
    return out


def main(argv: list[str]) -> int:
    t_import = time.monotonic()
    import torch

    report: dict[str, Any] = {}
    try:
        import sgl_kernel
    except Exception as exc:
        report["import_error"] = f"{type(exc).__name__}: {exc}"[:500]
        Path(argv[0]).write_text(json.dumps(report, indent=1))
        return 1
    report["import_s"] = round(time.monotonic() - t_import, 2)
    dev = torch.device("cuda")
    bs, n, vocab = 2, 8, 4096
    probs = torch.softmax(torch.randn(bs * n, vocab, device=dev), -1)
    top_ks = torch.full((bs * n,), 20, dtype=torch.int32, device=dev)
    top_ps = torch.full((bs * n,), 0.9, dtype=torch.float32, device=dev)
    report["top_k_renorm_prob"] = _timed(lambda: sgl_kernel.top_k_renorm_prob(probs, top_ks))
    report["top_p_renorm_prob"] = _timed(lambda: sgl_kernel.top_p_renorm_prob(probs, top_ps))

    def tree() -> None:
        target = probs.view(bs, n, vocab).contiguous()
        chain = torch.arange(n, dtype=torch.int64, device=dev)
        nxt = torch.where(chain + 1 < n, chain + 1, -1).repeat(bs, 1)
        sgl_kernel.tree_speculative_sampling_target_only(
            predicts=torch.zeros(bs * n, dtype=torch.int32, device=dev),
            accept_index=torch.zeros(bs, n, dtype=torch.int32, device=dev),
            accept_token_num=torch.zeros(bs, dtype=torch.int32, device=dev),
            candidates=torch.randint(0, vocab, (bs, n), dtype=torch.int64, device=dev),
            retrive_index=(torch.arange(bs * n, dtype=torch.int64, device=dev).view(bs, n)),
            retrive_next_token=nxt,
            retrive_next_sibling=torch.full((bs, n), -1, dtype=torch.int64, device=dev),
            uniform_samples=torch.rand(bs, n, device=dev),
            uniform_samples_for_final_sampling=torch.rand(bs, device=dev),
            target_probs=target, draft_probs=torch.zeros_like(target),
            threshold_single=1.0, threshold_acc=1.0, deterministic=True)

    report["tree_speculative_sampling_target_only"] = _timed(tree)
    report["total_s"] = round(time.monotonic() - t_import, 2)
    Path(argv[0]).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
