"""Results folded over repeats: one row per configuration x workload x concurrency x sampling.

Pure functions over a results file; the report, its charts and recommend all read these rows,
so what a chart shows, what a table says and what recommend chooses are the same numbers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ddtree_deploy.bench.results import Results

FOLDED = ("output_tok_s", "request_tok_s_p50", "ttft_p50_s", "tpot_p50_s", "icl_p50_s",
          "icl_p99_s", "accept_length")


@dataclass(frozen=True)
class Row:
    config: str
    name: str
    algorithm: str
    budget: int | None
    topk: int | None
    shadow_linear: bool
    workload: str
    concurrency: int
    sampling: str
    repeats: int
    values: dict[str, float | None]  # medians over repeats
    tok_s_min: float | None
    tok_s_max: float | None
    failed: int

    @property
    def tok_s(self) -> float | None:
        return self.values.get("output_tok_s")

    @property
    def spread(self) -> float | None:
        """(max - min) / median of output tok/s across repeats (0 with one repeat)."""
        if self.tok_s is None or self.tok_s_min is None or self.tok_s_max is None or \
                self.tok_s <= 0:
            return None
        return (self.tok_s_max - self.tok_s_min) / self.tok_s

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "name": self.name, "algorithm": self.algorithm,
                "budget": self.budget, "topk": self.topk, "shadow_linear": self.shadow_linear,
                "workload": self.workload, "concurrency": self.concurrency,
                "sampling": self.sampling, "repeats": self.repeats, **self.values,
                "tok_s_min": self.tok_s_min, "tok_s_max": self.tok_s_max,
                "spread": self.spread, "failed": self.failed}


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def fold(results: Results) -> list[Row]:
    groups: dict[tuple[str, str, int, str], list[dict[str, Any]]] = {}
    for cell in results.cells:
        key = (cell["config"], cell["workload"], int(cell["concurrency"]), cell["sampling"])
        groups.setdefault(key, []).append(cell["metrics"])
    order = {k: i for i, k in enumerate(results.configs)}
    rows = []
    for (config, workload, concurrency, sampling), metrics in sorted(
            groups.items(), key=lambda kv: (order.get(kv[0][0], 99), *kv[0][1:])):
        conf = results.configs[config].get("config", {})
        values = {k: _median([float(m[k]) for m in metrics if m.get(k) is not None])
                  for k in FOLDED}
        tok = [float(m["output_tok_s"]) for m in metrics if m.get("output_tok_s") is not None]
        rows.append(Row(config, conf.get("name") or config, conf.get("algorithm", "?"),
                        conf.get("budget"), conf.get("topk"), bool(conf.get("shadow_linear")),
                        workload, concurrency, sampling, len(metrics), values,
                        min(tok) if tok else None, max(tok) if tok else None,
                        sum(int(m.get("failed") or 0) for m in metrics)))
    return rows


def axes(rows: list[Row]) -> tuple[list[str], list[int], list[str]]:
    """Workloads, concurrency levels and sampling modes present, in their order."""
    workloads: list[str] = []
    conc: list[int] = []
    samp: list[str] = []
    for r in rows:
        for seq, v in ((workloads, r.workload), (conc, r.concurrency), (samp, r.sampling)):
            if v not in seq:
                seq.append(v)  # type: ignore[arg-type]
    return workloads, sorted(conc), samp
