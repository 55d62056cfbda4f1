"""bench report and recommend on a recorded results file (tests/data/bench/, README.md there).

Nothing here times anything: the numbers come from the file, and the tests check that the
charts plot exactly those numbers, the tables show them and recommend chooses from them.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.bench import charts
from ddtree_deploy.bench.recommend import NoDflash, recommend
from ddtree_deploy.bench.report import build_report
from ddtree_deploy.bench.results import Results
from ddtree_deploy.bench.summary import fold

RECORDED = Path(__file__).parent / "data" / "bench" / "standin-sweep.json"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddtree_deploy.cli", *args],
                          capture_output=True, text=True, timeout=300, check=False)


def _medians(results: Results, metric: str) -> dict[tuple[str, str, int, str], float]:
    """Straight from the cells: the median over repeats of one metric."""
    groups: dict[tuple[str, str, int, str], list[float]] = {}
    for c in results.cells:
        value = c["metrics"].get(metric)
        if value is not None:
            key = (c["config"], c["workload"], int(c["concurrency"]), c["sampling"])
            groups.setdefault(key, []).append(float(value))
    return {k: statistics.median(v) for k, v in groups.items()}


@pytest.fixture(scope="module")
def results() -> Results:
    return Results.load(RECORDED)


def test_recorded_file_is_a_full_grid_with_repeats(results: Results) -> None:
    keys = {(c["config"], c["workload"], c["concurrency"], c["sampling"]) for c in results.cells}
    assert len(results.cells) == 2 * len(keys)  # two repeats of every cell
    assert {"nospec", "dflash", "ddtree-15-8", "ddtree-15-8-shadow"} <= set(results.configs)
    assert results.data["synthetic"] is True


def test_every_chart_plots_the_results_and_its_csv_holds_the_same(results: Results,
                                                                   tmp_path: Path) -> None:
    made = build_report(results, tmp_path)
    tok = _medians(results, "output_tok_s")
    acc = _medians(results, "accept_length")
    assert len(made.charts) == 6  # three charts x greedy, sampled
    for name, plotted in made.charts.items():
        png, data = tmp_path / f"{name}.png", tmp_path / f"{name}.csv"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with data.open() as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) == len(plotted) > 0
        sampling = name.rsplit("_", 1)[1]
        for row, point in zip(rows, plotted, strict=True):
            assert float(row["y"]) == pytest.approx(point["y"], rel=1e-12)
            conf = results.configs[row["config"]]["config"]
            if name.startswith("dflash"):
                workload, conc = row["panel"].split(" c=")
            else:
                workload, conc = row["panel"], row["series"].rsplit("c=", 1)[1]
            key = (row["config"], workload, int(conc), sampling)
            want = acc if name.startswith("accept") else tok
            assert float(row["y"]) == pytest.approx(want[key], rel=1e-9), (name, row)
            if name.startswith(("tok_s", "accept")) and row["x"]:
                assert int(row["x"]) == conf["budget"]


def test_the_axes_hold_exactly_the_plotted_rows(results: Results) -> None:
    import matplotlib.pyplot as plt

    rows = fold(results)
    fig, plotted = charts.tok_s_vs_budget(rows, "greedy")
    try:
        lines: dict[tuple[str, str], list[list[tuple[float, float]]]] = {}
        for ax in fig.axes:
            for line in ax.get_lines():
                lines.setdefault((ax.get_title(), line.get_label()), []).append(
                    list(zip(line.get_xdata(), line.get_ydata(), strict=True)))
        for point in plotted:
            drawn = lines[(point["panel"], point["series"])]
            if point["x"] is None:  # DFlash level: a horizontal line at y
                assert any(all(y == point["y"] for _, y in seg) for seg in drawn)
            else:
                assert any((point["x"], point["y"]) in seg for seg in drawn)
        drawn_points = [len(seg) for segs in lines.values() for seg in segs
                        if not all(y == seg[0][1] for _, y in seg)]
        assert sum(drawn_points) <= len(plotted)
    finally:
        plt.close(fig)
    fig, plotted = charts.dflash_vs_ddtree(rows, "sampled")
    try:
        heights = sorted(round(p.get_height(), 9) for p in fig.axes[0].patches)
        assert heights == sorted(round(p["y"], 9) for p in plotted)
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        assert labels[0] == f"{rows[0].workload}\nc={min(r.concurrency for r in rows)}"
        assert fig.axes[0].get_ylabel() == "output tokens/s (all requests)"
    finally:
        plt.close(fig)


def test_best_ddtree_bar_is_the_fastest_ddtree_of_its_cell(results: Results) -> None:
    tok = _medians(results, "output_tok_s")
    for point in charts.dflash_vs_ddtree(fold(results), "greedy")[1]:
        if point["series"] != "best DDTree":
            continue
        workload, conc = point["panel"].split(" c=")
        rivals = [v for (cfg, w, c, s), v in tok.items() if cfg.startswith("ddtree")
                  and (w, c, s) == (workload, int(conc), "greedy")]
        assert point["y"] == max(rivals)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def test_recommend_margin_is_the_geometric_mean_over_dflash(results: Results) -> None:
    tok = _medians(results, "output_tok_s")
    rec = recommend(fold(results))
    cells = sorted({k[1:] for k in tok})
    scores = {cfg: _geomean([tok[(cfg, *c)] / tok[("dflash", *c)] for c in cells])
              for cfg in results.configs}
    overall = rec["overall"]
    assert overall is not None
    assert overall.config == max(scores, key=lambda k: scores[k])
    assert overall.margin == pytest.approx(scores[overall.config] - 1)
    assert scores["dflash"] == pytest.approx(1.0)
    # spread: the chosen configuration's worst (max - min) / median over repeats
    spreads = []
    for c in cells:
        got = [float(x["metrics"]["output_tok_s"]) for x in results.cells
               if (x["config"], x["workload"], x["concurrency"], x["sampling"])
               == (overall.config, *c)]
        spreads.append((max(got) - min(got)) / statistics.median(got))
    assert overall.spread == pytest.approx(max(spreads))
    for workload, choice in rec["workloads"].items():
        mine = [c for c in cells if c[0] == workload]
        best = max(results.configs, key=lambda k: _geomean(
            [tok[(k, *c)] / tok[("dflash", *c)] for c in mine]))
        assert choice.config == best


def test_recommend_without_dflash_says_so(results: Results, tmp_path: Path) -> None:
    data = json.loads(RECORDED.read_text())
    data["cells"] = [c for c in data["cells"] if c["config"] != "dflash"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    with pytest.raises(NoDflash):
        recommend(fold(Results.load(path)))
    out = _cli("bench", "recommend", "--results", str(path))
    assert out.returncode == 2 and "no DFlash measurement" in out.stderr
    assert "Traceback" not in out.stderr


def test_report_cli_writes_markdown_html_latex_and_labels_synthetic(tmp_path: Path) -> None:
    data = json.loads(RECORDED.read_text())
    data["label"] = "synthetic <script>alert(1)</script> & [bold]x[/bold]"
    src = tmp_path / "results.json"
    src.write_text(json.dumps(data))
    out = _cli("bench", "report", "--results", str(src), "--out", str(tmp_path / "r"), "--json")
    assert out.returncode == 0, out.stderr
    made: dict[str, Any] = json.loads(out.stdout)["results"]
    md = (tmp_path / "r" / "report.md").read_text()
    page = (tmp_path / "r" / "report.html").read_text()
    tex = (tmp_path / "r" / "report.tex").read_text()
    assert "**SYNTHETIC numbers**" in md and "\\[bold\\]x\\[/bold\\]" in md
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "\\begin{tabular}" in tex and "\\&" in tex
    for name in ("tok_s_vs_budget_greedy", "accept_vs_budget_sampled", "dflash_vs_ddtree_greedy"):
        assert f"![{name}]({name}.png)" in md and f'src="{name}.png"' in page
        assert (tmp_path / "r" / f"{name}.csv").is_file()
    flags = " ".join(Results.load(src).configs["ddtree-15-8"]["flags"])
    assert "--speculative-ddtree-budget 15" in flags and f"`{flags}`" in md
    assert made["recommendation"]["overall"]["config"] == \
        recommend(fold(Results.load(src)))["overall"].config


def test_report_of_a_missing_or_broken_file_exits_2(tmp_path: Path) -> None:
    out = _cli("bench", "report", "--results", str(tmp_path / "none.json"))
    assert out.returncode == 2 and "no bench results at" in out.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something-else"}')
    out = _cli("bench", "report", "--results", str(bad))
    assert out.returncode == 2 and "not a bench results file" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_grid_without_dflash_draws_no_empty_dflash_series(results: Results) -> None:
    """The dummy-weights grid on the H200 had no DFLASH: its chart showed a DFlash legend entry
    in no-speculation's colour and a gap in every group."""
    rows = [r for r in fold(results) if r.algorithm != "dflash"]
    fig, plotted = charts.dflash_vs_ddtree(rows, "greedy")
    try:
        ax = fig.axes[0]
        legend = ax.get_legend()
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels == ["no speculation", "best DDTree"]
        assert {p["series"] for p in plotted} == set(labels)
        for handle, container in zip(legend.legend_handles, ax.containers, strict=True):
            assert handle.get_facecolor() == container.patches[0].get_facecolor()
        assert ax.get_title().startswith("No speculation (no DFlash measured) against")
        # two bars per group, side by side around the group's tick
        per_group: dict[int, list[float]] = {}
        for patch in ax.patches:
            centre = patch.get_x() + patch.get_width() / 2
            per_group.setdefault(round(centre), []).append(centre)
        assert all(len(xs) == 2 and sum(xs) / 2 == pytest.approx(g) for g, xs in per_group.items())
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
