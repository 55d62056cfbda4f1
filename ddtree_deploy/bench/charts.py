"""The report's charts (matplotlib, Agg): each returns its figure and the rows it plotted.

- tok/s against DDTree budget, one panel per workload, a line per (top-k, concurrency), DFlash
  as a dashed level per concurrency;
- accept length against budget, the same layout;
- DFlash against the best DDTree (and no speculation) per workload and concurrency, as bars.

One figure per sampling mode. The rows are written beside each PNG as CSV (report.py), and the
tests check that what the axes hold equals those rows and the results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ddtree_deploy.bench.escape import mpl
from ddtree_deploy.bench.summary import Row, axes

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
CSV_FIELDS = ("chart", "panel", "series", "x", "y", "config")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(n: int) -> tuple[int, int]:
    cols = min(3, max(1, n))
    return math.ceil(n / cols), cols


def _vs_budget(rows: list[Row], sampling: str, metric: str, ylabel: str, chart: str,
               title: str) -> tuple[Any, list[dict[str, Any]]]:
    plt = _pyplot()
    workloads, concs, _ = axes(rows)
    nrows, ncols = _grid(len(workloads))
    fig, grid = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows), squeeze=False)
    plotted: list[dict[str, Any]] = []
    tree = [r for r in rows if r.sampling == sampling and r.algorithm == "ddtree"
            and not r.shadow_linear]
    topks = sorted({r.topk for r in tree if r.topk is not None})
    for i, workload in enumerate(workloads):
        ax = grid[i // ncols][i % ncols]
        for ci, conc in enumerate(concs):
            color = COLORS[ci % len(COLORS)]
            for ki, topk in enumerate(topks):
                pts = sorted((r.budget, r.values.get(metric), r.config) for r in tree
                             if r.workload == workload and r.concurrency == conc
                             and r.topk == topk and r.budget is not None
                             and r.values.get(metric) is not None)
                if not pts:
                    continue
                series = f"DDTree top-k {topk}, c={conc}"
                # later concurrencies thinner and smaller, drawn on top: where two lines
                # coincide (equal accept lengths) both stay visible
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os^D"[ki % 4],
                        color=color, alpha=1.0 - 0.3 * ki, label=series,
                        linewidth=max(1.0, 3.0 - 1.0 * ci), markersize=max(4.0, 9.0 - 2.5 * ci))
                plotted += [{"chart": chart, "panel": workload, "series": series, "x": p[0],
                             "y": p[1], "config": p[2]} for p in pts]
            for r in rows:
                if (r.sampling, r.algorithm, r.workload, r.concurrency) == \
                        (sampling, "dflash", workload, conc) and r.values.get(metric) is not None:
                    series = f"DFlash, c={conc}"
                    ax.axhline(r.values[metric], color=color, linestyle="--", linewidth=1.2,
                               label=series)
                    plotted.append({"chart": chart, "panel": workload, "series": series,
                                    "x": None, "y": r.values[metric], "config": r.config})
        ax.set_title(mpl(workload))  # names from a file: never math text
        ax.set_xlabel("DDTree budget (nodes)")
        ax.set_ylabel(ylabel)
        if tree:
            ax.set_xscale("log", base=2)
            budgets = sorted({r.budget for r in tree if r.budget})
            ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    for j in range(len(workloads), nrows * ncols):
        grid[j // ncols][j % ncols].set_visible(False)
    handles, labels = grid[0][0].get_legend_handles_labels()
    fig.suptitle(mpl(f"{title} ({sampling})"))
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8,
                   frameon=False)
    return fig, plotted


def tok_s_vs_budget(rows: list[Row], sampling: str) -> tuple[Any, list[dict[str, Any]]]:
    return _vs_budget(rows, sampling, "output_tok_s", "output tokens/s (all requests)",
                      f"tok_s_vs_budget_{sampling}", "Output throughput against DDTree budget")


def accept_vs_budget(rows: list[Row], sampling: str) -> tuple[Any, list[dict[str, Any]]]:
    return _vs_budget(rows, sampling, "accept_length", "accept length (tokens / verify round)",
                      f"accept_vs_budget_{sampling}", "Accept length against DDTree budget")


def best_ddtree(rows: list[Row], workload: str, conc: int, sampling: str) -> Row | None:
    tree = [r for r in rows if (r.algorithm, r.workload, r.concurrency, r.sampling) ==
            ("ddtree", workload, conc, sampling) and r.tok_s is not None]
    return max(tree, key=lambda r: (r.tok_s or 0.0, -(r.budget or 0))) if tree else None


def dflash_vs_ddtree(rows: list[Row], sampling: str) -> tuple[Any, list[dict[str, Any]]]:
    plt = _pyplot()
    workloads, concs, _ = axes(rows)
    groups = [(w, c) for w in workloads for c in concs]
    # wide enough to read a normal grid; bounded, so a file with thousands of cells cannot ask
    # for an image past matplotlib's limits (or the memory)
    fig, ax = plt.subplots(figsize=(min(max(6.0, 1.3 * len(groups) + 2), 250.0), 4.6))
    chart = f"dflash_vs_ddtree_{sampling}"
    plotted: list[dict[str, Any]] = []
    pick: list[tuple[str, Callable[[str, int], Row | None]]] = [
        ("no speculation", lambda w, c: _one(rows, "none", w, c, sampling)),
        ("DFlash", lambda w, c: _one(rows, "dflash", w, c, sampling)),
        ("best DDTree", lambda w, c: best_ddtree(rows, w, c, sampling)),
    ]
    # A series with no measurement at all (e.g. no DFLASH in the grid) gets no bar slot, no
    # legend entry and no place in the title: an empty bar set would show a legend swatch in
    # the wrong colour and a gap in every group.
    present = []
    for si, (series, get) in enumerate(pick):
        cells = [(gi, r) for gi, (w, c) in enumerate(groups)
                 if (r := get(w, c)) is not None and r.tok_s is not None]
        if cells:
            present.append((si, series, cells))
    width = 0.8 / max(1, len(present))
    for slot, (si, series, cells) in enumerate(present):
        xs, ys = [], []
        for gi, row in cells:
            w, c = groups[gi]
            x = gi + (slot - (len(present) - 1) / 2) * width
            xs.append(x)
            ys.append(row.tok_s)
            plotted.append({"chart": chart, "panel": f"{w} c={c}", "series": series, "x": gi,
                            "y": row.tok_s, "config": row.config})
            if series == "best DDTree":
                ax.annotate(f"{row.budget}/{row.topk}", (x, row.tok_s), ha="center",
                            va="bottom", fontsize=7)
        ax.bar(xs, ys, width=width, label=series, color=COLORS[si])
    shown = [series for _, series, _ in present]
    rival = ("DFlash" if "DFlash" in shown else "No speculation (no DFlash measured)"
             if "no speculation" in shown else "No baseline measured")
    tree = "the best DDTree" if "best DDTree" in shown else "DDTree (none measured)"
    ax.set_xticks(range(len(groups)), [f"{mpl(w)}\nc={c}" for w, c in groups], fontsize=8)
    ax.set_ylabel("output tokens/s (all requests)")
    ax.set_title(mpl(f"{rival} against {tree} budget/top-k per workload ({sampling})"))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")  # "best" is slow on many bars
    fig.tight_layout()
    return fig, plotted


def _one(rows: list[Row], algorithm: str, w: str, c: int, sampling: str) -> Row | None:
    for r in rows:
        if (r.algorithm, r.workload, r.concurrency, r.sampling) == (algorithm, w, c, sampling):
            return r
    return None


CHARTS = (tok_s_vs_budget, accept_vs_budget, dflash_vs_ddtree)
