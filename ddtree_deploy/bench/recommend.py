"""Choose the best configuration per workload and overall, with its margin over DFlash.

A configuration's score on a set of cells (concurrency x sampling, per workload; every cell
for overall) is the geometric mean of its output tok/s relative to DFlash's in the same cell;
DFlash scores 1 by definition and the margin is score - 1. The spread is the largest
(max - min) / median of output tok/s across repeats among the chosen configuration's cells; a
margin smaller than the spread is flagged as within the noise. Only configurations measured
in every cell of the set, with no failed request, compete.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ddtree_deploy.bench.summary import Row


@dataclass(frozen=True)
class Choice:
    scope: str  # a workload, or "overall"
    config: str
    name: str
    algorithm: str
    budget: int | None
    topk: int | None
    shadow_linear: bool
    score: float  # geometric mean of tok/s relative to DFlash (1.0 = DFlash)
    margin: float  # score - 1
    spread: float  # max relative spread over repeats among its cells
    cells: int
    runner_up: str | None

    @property
    def within_noise(self) -> bool:
        return self.algorithm != "dflash" and abs(self.margin) <= self.spread

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope, "config": self.config, "name": self.name,
                "algorithm": self.algorithm, "budget": self.budget, "topk": self.topk,
                "shadow_linear": self.shadow_linear, "score": round(self.score, 6),
                "margin_over_dflash": round(self.margin, 6), "spread": round(self.spread, 6),
                "within_noise": self.within_noise, "cells": self.cells,
                "runner_up": self.runner_up}


class NoDflash(ValueError):
    """The results have no DFlash measurement to compare with."""


def _choose(rows: list[Row], scope: str) -> Choice | None:
    cells = sorted({(r.workload, r.concurrency, r.sampling) for r in rows})
    base = {(r.workload, r.concurrency, r.sampling): r.tok_s for r in rows
            if r.algorithm == "dflash" and r.tok_s}
    if not base:
        raise NoDflash(f"{scope}: no DFlash measurement to compare with")
    cells = [c for c in cells if c in base]
    by_config: dict[str, dict[tuple[str, int, str], Row]] = {}
    for r in rows:
        by_config.setdefault(r.config, {})[(r.workload, r.concurrency, r.sampling)] = r
    scored: list[tuple[float, Row, float]] = []
    for got in by_config.values():
        mine = [got.get(c) for c in cells]
        if any(r is None or not r.tok_s or r.failed for r in mine):
            continue
        ratios = [r.tok_s / base[c] for r, c in zip(mine, cells, strict=True)
                  if r is not None and r.tok_s]
        score = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        if not math.isfinite(score):  # never a "+inf%" choice, whatever the file held
            continue
        spread = max((r.spread or 0.0) for r in mine if r is not None)
        first = next(r for r in mine if r is not None)
        scored.append((score, first, spread))
    if not scored:
        return None
    scored.sort(key=lambda s: (-s[0], s[1].budget or 0, s[1].config))
    score, row, spread = scored[0]
    return Choice(scope, row.config, row.name, row.algorithm, row.budget, row.topk,
                  row.shadow_linear, score, score - 1.0, spread, len(cells),
                  scored[1][1].config if len(scored) > 1 else None)


def recommend(rows: list[Row]) -> dict[str, Any]:
    """{"workloads": {name: Choice}, "overall": Choice}; raises NoDflash without DFlash."""
    workloads: dict[str, Choice] = {}
    for w in dict.fromkeys(r.workload for r in rows):
        choice = _choose([r for r in rows if r.workload == w], w)
        if choice is not None:
            workloads[w] = choice
    return {"workloads": workloads, "overall": _choose(rows, "overall")}
