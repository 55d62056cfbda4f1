"""Per-round cost and tok/s of the rehearsal's servers, alternating rounds (CUDA graphs on).

Per-round cost is ``e2e_latency / spec_verify_ct`` of one greedy request at batch 1 (median over
rounds); tok/s is completion tokens over wall seconds, at batch 1 and at batch 8 (8 requests at
once). Servers are measured one after another within a round, in reverse order every other round,
so a drift of the shared GPU (or host) hits every server alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from rehearsal import client

PROMPT = [11, 12, 100]


def _one(port: int, tokens: int, batch: int) -> dict[str, Any]:
    t0 = time.monotonic()
    answers = client.batch(port, [PROMPT] * batch, [tokens] * batch, concurrency=batch)
    wall = time.monotonic() - t0
    bad = [a.error for a in answers if a.error]
    done = sum(len(a.output_ids) for a in answers)
    first = answers[0].meta
    verify = int(first.get("spec_verify_ct") or 0)
    e2e = float(first.get("e2e_latency") or 0.0)
    return {"tok_s": done / wall if wall > 0 else 0.0, "errors": bad[:2],
            "round_ms": 1000 * e2e / verify if verify else None,
            "accept_length": first.get("spec_accept_length"), "verify_ct": verify}


def measure(servers: Sequence[tuple[str, int]], *, rounds: int = 3, tokens: int = 256,
            batches: Sequence[int] = (1, 8)) -> dict[str, Any]:
    """``servers``: (name, port). Returns per server and batch the runs and their medians."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {n: {b: [] for b in batches}
                                                        for n, _ in servers}
    for _name, port in servers:  # warm-up: CUDA graphs and kernels of every batch size
        for b in batches:
            _one(port, 32, b)
    for i in range(rounds):  # the order reverses every other round (ABBA): no server is last
        for name, port in (servers if i % 2 == 0 else list(reversed(servers))):
            for b in batches:
                runs[name][b].append(_one(port, tokens, b))
    out: dict[str, Any] = {}
    for name, per in runs.items():
        out[name] = {}
        for b, items in per.items():
            toks = [r["tok_s"] for r in items]
            cost = [r["round_ms"] for r in items if r["round_ms"] is not None]
            out[name][f"batch{b}"] = {
                "tok_s_median": statistics.median(toks), "tok_s": toks,
                "round_ms_median": statistics.median(cost) if cost else None,
                "accept_length": items[-1]["accept_length"],
                "errors": [e for r in items for e in r["errors"]][:3],
            }
    return out
