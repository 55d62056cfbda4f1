"""A cell's metrics from the load generator's raw answers (pure functions).

- output tok/s: tokens of the answered requests / the cell's wall time (all requests at once);
- per-request tok/s: tokens / e2e of each request, median;
- TTFT: time to the first streamed token, p50 and p99;
- TPOT: (e2e - TTFT) / (tokens - 1) of each request, median;
- inter-chunk latency (ICL): the gaps between streamed chunks, p50 and p99 (a speculative
  server sends several tokens per chunk: this is its round time as a client sees it);
- accept length: completion tokens / verify rounds summed over the requests (SGLang's
  spec_accept_length is this ratio per request); verify count: the rounds summed;
- failed: requests that got no finished answer (error, HTTP status, cut stream).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

METRICS = ("output_tok_s", "request_tok_s_p50", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
           "icl_p50_s", "icl_p99_s", "accept_length", "verify_ct", "requests", "failed",
           "tokens", "wall_s")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi:
        return float(ordered[lo])
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def _gaps(arrivals: Iterable[Sequence[float]]) -> list[float]:
    times = [float(a[0]) for a in arrivals]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def cell_metrics(raw: dict[str, Any]) -> dict[str, Any]:
    requests = raw.get("requests") or []
    ok = [r for r in requests if r.get("ok")]
    tokens = sum(int(r.get("tokens") or 0) for r in ok)
    wall = float(raw.get("wall_s") or 0.0)
    ttft = [float(r["ttft"]) for r in ok if r.get("ttft") is not None]
    tpot = [(float(r["e2e"]) - float(r["ttft"])) / (int(r["tokens"]) - 1)
            for r in ok if r.get("ttft") is not None and int(r.get("tokens") or 0) > 1]
    per_request = [int(r["tokens"]) / float(r["e2e"]) for r in ok if float(r.get("e2e") or 0) > 0]
    gaps = [g for r in ok for g in _gaps(r.get("arrivals") or [])]
    verify = [int(r["meta"]["spec_verify_ct"]) for r in ok
              if isinstance((r.get("meta") or {}).get("spec_verify_ct"), int)]
    verified_tokens = sum(int(r["meta"].get("completion_tokens") or r["tokens"]) for r in ok
                          if isinstance((r.get("meta") or {}).get("spec_verify_ct"), int))
    return {
        "output_tok_s": _round(tokens / wall if wall > 0 else None, 3),
        "request_tok_s_p50": _round(percentile(per_request, 50), 3),
        "ttft_p50_s": _round(percentile(ttft, 50)),
        "ttft_p99_s": _round(percentile(ttft, 99)),
        "tpot_p50_s": _round(percentile(tpot, 50)),
        "icl_p50_s": _round(percentile(gaps, 50)),
        "icl_p99_s": _round(percentile(gaps, 99)),
        "accept_length": _round(verified_tokens / sum(verify) if sum(verify) else None, 4),
        "verify_ct": sum(verify) if verify else None,
        "requests": len(requests),
        "failed": len(requests) - len(ok),
        "tokens": tokens,
        "wall_s": _round(wall, 4),
    }


def first_errors(raw: dict[str, Any], limit: int = 3) -> list[str]:
    """The first distinct error texts of a cell (for the report and the console)."""
    seen: list[str] = []
    for r in raw.get("requests") or []:
        err = r.get("error")
        if err and err not in seen:
            seen.append(str(err)[:300])
        if len(seen) >= limit:
            break
    return seen
