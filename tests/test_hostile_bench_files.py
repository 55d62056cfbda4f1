"""Hostile bench files: results and grids, reports from them, and where reports are written.

Every case is data: what a careless or hostile user puts in the file (or where they point
the tool), and the fragment of the one clear refusal expected (exit 2, the file named).
Results and grids go through one bounded reader (config/yamlload.read_config_bytes): a
FIFO, a device or a huge file is refused unread. Reports show every label as text in
Markdown, HTML, LaTeX and the charts, and are written without following a planted link.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddtree_deploy.bench import escape
from ddtree_deploy.bench import grid as gridmod
from ddtree_deploy.bench.recommend import recommend
from ddtree_deploy.bench.report import build_report, out_folder
from ddtree_deploy.bench.results import Results
from ddtree_deploy.bench.summary import fold
from ddtree_deploy.errors import DeployError, ExitCode

RECORDED = Path(__file__).parent / "data" / "bench" / "standin-sweep.json"
BASE: dict[str, Any] = json.loads(RECORDED.read_text())
WORKLOADS = ("code", "math", "json", "chat", "agentic")


def _metric(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["cells"][0]["metrics"][name] = value
    return edit


def _cell(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["cells"][0][name] = value
    return edit


def _top(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d[name] = value
    return edit


def _deep(depth: int) -> Any:
    value: Any = 1.0
    for _ in range(depth):
        value = [value]
    return value


def _many_workloads(d: dict[str, Any]) -> None:
    cell = d["cells"][0]
    d["cells"] += [{**cell, "workload": f"w{i}"} for i in range(300)]


def _many_levels(d: dict[str, Any]) -> None:
    cell = d["cells"][0]
    d["cells"] += [{**cell, "concurrency": i} for i in range(1, 100)]


# (case id, edit of the recorded results, or raw text of the file; fragment of the refusal)
RESULTS_CASES: list[tuple[str, Callable[[dict[str, Any]], None] | str, str]] = [
    ("tok-s-nan", "NaN", "NaN is not a number"),
    ("tok-s-infinity", "Infinity", "Infinity is not a number"),
    ("tok-s-minus-infinity", "-Infinity", "-Infinity is not a number"),
    ("tok-s-negative", _metric("output_tok_s", -5.0), "cells[0].metrics.output_tok_s"),
    ("tok-s-string", _metric("output_tok_s", "fast"), "got 'fast'"),
    ("tok-s-bool", _metric("output_tok_s", True), "cells[0].metrics.output_tok_s"),
    ("tok-s-huge", _metric("output_tok_s", 1e300), "less than or equal"),
    ("tok-s-list", _metric("output_tok_s", [1.0]), "cells[0].metrics.output_tok_s"),
    ("accept-negative", _metric("accept_length", -1), "cells[0].metrics.accept_length"),
    ("failed-float", _metric("failed", 0.5), "cells[0].metrics.failed"),
    ("metrics-deep", _metric("output_tok_s", _deep(200)), "cells[0].metrics.output_tok_s"),
    ("metrics-not-mapping", _cell("metrics", [1, 2]), "cells[0].metrics"),
    ("cell-not-mapping", lambda d: d["cells"].insert(0, 5), "cells[0]"),
    ("cell-string", lambda d: d["cells"].insert(0, "cell"), "cells[0]"),
    ("cells-mapping", _top("cells", {"a": 1}), "cells"),
    ("configs-list", _top("configs", []), "configs"),
    ("config-not-mapping", lambda d: d["configs"].update(dflash=3), "configs.dflash"),
    ("config-name-list", lambda d: d["configs"]["dflash"]["config"].update(name=["x"]),
     "configs.dflash.config.name"),
    ("concurrency-zero", _cell("concurrency", 0), "cells[0].concurrency"),
    ("concurrency-string", _cell("concurrency", "4"), "cells[0].concurrency"),
    ("concurrency-float", _cell("concurrency", 1.5), "cells[0].concurrency"),
    ("sampling-path", _cell("sampling", "../../../tmp/x"), "cells[0].sampling"),
    ("workload-empty", _cell("workload", ""), "cells[0].workload"),
    ("workload-not-text", _cell("workload", {"a": 1}), "cells[0].workload"),
    ("unknown-config", _cell("config", "ghost"), "'ghost' is not one of the file's configs"),
    ("missing-metrics", lambda d: d["cells"][0].pop("metrics"), "cells[0].metrics"),
    ("gpus-text", lambda d: d["host_facts"].update(gpus="H200"), "host_facts.gpus"),
    ("gpu-not-mapping", lambda d: d["host_facts"].update(gpus=[1]), "host_facts.gpus[0]"),
    ("grid-list", _top("grid", [1]), "grid"),
    ("label-number", _top("label", 5), "label"),
    ("history-not-list", _top("facts_history", 3), "facts_history"),
    ("too-many-workloads", _many_workloads, "distinct workload values, more than a report"),
    ("too-many-levels", _many_levels, "distinct concurrency values, more than a report"),
    ("tok-s-overflows-to-inf", "1e400", "cells[0].metrics.output_tok_s"),
    ("tok-s-5000-digits", "9" * 5000, "not a bench results file"),
    ("duplicate-key", '{"schema": "ddtree-deploy-bench/1", "host": "a", "host": "b"}',
     "duplicate key 'host'"),
    ("top-list", "[]", "not a bench results file"),
    ("no-schema", '{"host": "h"}', "schema ddtree-deploy-bench/1 expected"),
    ("empty", "", ":1:1: not a bench results file"),
    ("truncated", '{"schema": "ddtree-deploy-bench/1",\n "cells": [', ":2:"),
    ("deep-json", "[" * 200_000 + "]" * 200_000, "not a bench results file"),
]


def _write_results(tmp_path: Path, edit: Callable[[dict[str, Any]], None] | str) -> Path:
    path = tmp_path / "results.json"
    if isinstance(edit, str):
        if edit in ("NaN", "Infinity", "-Infinity", "1e400") or edit.isdigit():
            text = json.dumps(BASE).replace('"output_tok_s": ', f'"output_tok_s": {edit}, "x": ',
                                            1)
        else:
            text = edit
        path.write_text(text, encoding="utf-8")
        return path
    data = copy.deepcopy(BASE)
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(("case", "edit", "fragment"), RESULTS_CASES,
                         ids=[c[0] for c in RESULTS_CASES])
def test_a_hostile_results_file_is_refused_naming_file_and_field(
        tmp_path: Path, case: str, edit: Callable[[dict[str, Any]], None] | str,
        fragment: str) -> None:
    path = _write_results(tmp_path, edit)
    with pytest.raises(DeployError) as info:
        Results.load(path)
    assert info.value.exit_code == ExitCode.USAGE
    assert str(path) in str(info.value)
    assert fragment in str(info.value), str(info.value)


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _link_to_fifo(tmp_path: Path) -> Path:
    link = tmp_path / "link.json"
    link.symlink_to(_fifo(tmp_path))
    return link


def _huge(tmp_path: Path) -> Path:
    path = tmp_path / "huge"
    with path.open("wb") as fh:
        fh.truncate((64 << 20) + 1)
    return path


def _not_utf8(tmp_path: Path) -> Path:
    path = tmp_path / "latin1"
    path.write_bytes(b'{"schema": "caf\xe9"}')
    return path


# (case id, make the path; fragment) for both --results and --grid
PATH_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("fifo", _fifo, "not a regular file"),
    ("symlink-to-fifo", _link_to_fifo, "not a regular file"),
    ("dev-zero", lambda _: Path("/dev/zero"), "not a regular file"),
    ("folder", lambda p: p, "is a directory"),
    ("huge", _huge, "larger than"),
    ("not-utf8", _not_utf8, "not a UTF-8 text file"),
]


@pytest.mark.parametrize(("case", "make", "fragment"), PATH_CASES, ids=[c[0] for c in PATH_CASES])
def test_results_that_are_not_a_bounded_regular_file_are_refused_unread(
        tmp_path: Path, case: str, make: Callable[[Path], Path], fragment: str) -> None:
    path = make(tmp_path)
    with pytest.raises(DeployError) as info:
        Results.load(path)
    assert info.value.exit_code == ExitCode.USAGE
    assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize(("case", "make", "fragment"),
                         [c for c in PATH_CASES if c[0] != "huge"] +
                         [("huge", lambda p: _huge(p), "larger than 4 MiB")],
                         ids=[c[0] for c in PATH_CASES])
def test_grids_that_are_not_a_bounded_regular_file_are_refused_unread(
        tmp_path: Path, case: str, make: Callable[[Path], Path], fragment: str) -> None:
    path = make(tmp_path)
    with pytest.raises(DeployError) as info:
        gridmod.load(path, WORKLOADS)
    assert info.value.exit_code == ExitCode.USAGE
    assert fragment in str(info.value), str(info.value)


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi",
                                                                  strict=True))

# (case id, grid text, fragment)
BUDGET = "configs[0].budget"
GRID_CASES: list[tuple[str, str, str]] = [
    ("deep-nesting", "configs: " + "[" * 100 + "dflash" + "]" * 100 + "\n", "nested more than"),
    ("billion-laughs", LAUGHS + "configs: [dflash]\n", "more than 100000 nodes"),
    ("duplicate-key", "configs: [dflash]\nconfigs: [none]\n", "duplicate key 'configs'"),
    ("python-tag", "configs: !!python/object:os.system [x]\n", "tag"),
    ("time-limit-nan", "configs: [dflash]\ntime_limit_s: .nan\n", "time_limit_s: seconds"),
    ("time-limit-inf", "configs: [dflash]\ntime_limit_s: .inf\n", "time_limit_s: seconds"),
    ("budget-inf", "configs:\n  - {algorithm: ddtree, budget: .inf, topk: 8}\n", BUDGET),
    ("budget-string", "configs:\n  - {algorithm: ddtree, budget: '15', topk: 8}\n", BUDGET),
    ("budget-float", "configs:\n  - {algorithm: ddtree, budget: 15.0, topk: 8}\n", BUDGET),
    ("budget-bool", "configs:\n  - {algorithm: ddtree, budget: true, topk: 8}\n", BUDGET),
    ("name-dollar", "configs:\n  - {algorithm: dflash, name: '$x$'}\n", "name '$x$' must be"),
    ("name-newline", "configs:\n  - {algorithm: dflash, name: \"a\\n\"}\n", "must be letters"),
    ("configs-mapping", "configs: {dflash: 1}\n", "a non-empty list"),
    ("concurrency-nested", "configs: [dflash]\nconcurrency: [[1]]\n", "each value must be"),
    ("sampling-nested", "configs: [dflash]\nsampling: [[greedy]]\n", "sampling: expected"),
    ("nul", "configs: [\"dfl\\0ash\"]\n", "NUL"),
    ("too-many-levels", "configs: [dflash]\nrequests: 100\nconcurrency: [" +
     ", ".join(str(i) for i in range(1, 40)) + "]\n", "a report lays out at most 16"),
]


@pytest.mark.parametrize(("case", "text", "fragment"), GRID_CASES, ids=[c[0] for c in GRID_CASES])
def test_a_hostile_grid_is_refused_with_file_and_line(tmp_path: Path, case: str, text: str,
                                                      fragment: str) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DeployError) as info:
        gridmod.load(path, WORKLOADS)
    assert info.value.exit_code == ExitCode.USAGE
    assert str(path) in str(info.value)
    assert fragment in str(info.value), str(info.value)


def test_recommend_never_chooses_an_infinite_margin() -> None:
    data = copy.deepcopy(BASE)
    for cell in data["cells"]:
        if cell["config"] == "dflash":
            cell["metrics"]["output_tok_s"] = 5e-324  # finite, allowed, and a ratio overflows
    results = Results(RECORDED, data)
    rec = recommend(fold(results))
    for choice in [rec["overall"], *rec["workloads"].values()]:
        assert choice is None or choice.score < float("inf")


HOSTILE_LABELS = [
    "<img src=x onerror=alert(1)>",
    "| forged | table |\n|---|---|\n| 1 | 2 |",
    "x\n\\input{/etc/passwd}\n",
    "a\r\\write18{rm -rf ~}",
    "a\u2028\\input{x}",
    "$\\frac{1}{0}$ and a $ alone",
    "\x1b[31mred\x1b[0m \x9b31m",
    "`code` ``two`` [link](javascript:alert(1)) **bold** _x_ # h",
    "\u202etxt.exe",
]


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    data = copy.deepcopy(BASE)
    label = " ".join(HOSTILE_LABELS)
    data["label"] = "synthetic " + label
    names = {"code": "$x^2$ <b>code</b>", "math": "math\n| x |", "json": "json\\input{y}"}
    for cell in data["cells"]:
        cell["workload"] = names.get(cell["workload"], cell["workload"])
    data["configs"]["dflash"]["config"]["name"] = "=HYPERLINK(\"http://x\")" + HOSTILE_LABELS[0]
    data["configs"]["dflash"]["flags"] = ["--x", "`; rm` ```", "<script>"]
    path = tmp_path_factory.mktemp("hostile") / "results.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    out = path.parent / "report"
    build_report(Results.load(path), out)  # the charts draw: no math text parsed
    return {name: (out / name).read_text(encoding="utf-8")
            for name in ("report.md", "report.html", "report.tex", "summary.csv")}


def test_markdown_shows_labels_as_text(hostile_report: dict[str, str]) -> None:
    md = hostile_report["report.md"]
    outside_code = re.sub(r"(`+).*?\1", "", md)  # code spans show < as it is: never HTML
    for markup in ("<img", "<b>", "<script>", "](javascript", "**bold**", "[link]"):
        assert re.search(r"(?<!\\)" + re.escape(markup), outside_code) is None, markup
    assert "\\<img src=x onerror=alert(1)\\>" in md
    table_lines = [line for line in md.splitlines() if line.startswith("|")]
    assert all("forged" not in line for line in table_lines)  # the label made no table row
    assert "| x |" not in md
    assert "\x1b" not in md and "\u2028" not in md and "\u202e" not in md
    assert "````--x `; rm` ``` <script>````" in md  # one code span, longer fence than inside


def test_html_shows_labels_as_text(hostile_report: dict[str, str]) -> None:
    page = hostile_report["report.html"]
    assert "<img src=x" not in page and "<b>code" not in page and "<script>" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "\x1b" not in page and "\x9b" not in page


def test_csv_cells_are_never_formulas(hostile_report: dict[str, str]) -> None:
    for cell in ("=1+1", "+1", "-cmd", "@SUM(A1)"):
        assert escape.csv_cell(cell) == "'" + cell
    assert escape.csv_cell(-1.5) == -1.5 and escape.csv_cell("ddtree-15-8") == "ddtree-15-8"
    assert escape.csv_cell("a\nb") == "a\\x0ab"
    rows = list(__import__("csv").reader(hostile_report["summary.csv"].splitlines()))
    assert all(not cell.startswith(("=", "+", "@")) for row in rows for cell in row)
    assert any(cell.startswith("'=HYPERLINK") for row in rows for cell in row)


def test_latex_comment_and_cells_hold_the_label_whole(hostile_report: dict[str, str]) -> None:
    tex = hostile_report["report.tex"]
    lines = tex.splitlines()
    assert not any(line.lstrip().startswith(("\\input", "\\write18")) for line in lines)
    comment = next(line for line in lines if line.startswith("% SYNTHETIC"))
    assert "\\textbackslash{}input" in comment and "onerror" in comment
    assert "\\input{" not in tex and "\\write18" not in tex
    assert "\\$x\\textasciicircum{}2\\$" in tex


@pytest.mark.parametrize("label", HOSTILE_LABELS)
def test_each_escaper_leaves_no_line_break_or_markup(label: str) -> None:
    for fn in (escape.md, escape.html, escape.tex, escape.mpl, escape.md_code):
        text = fn(label)
        assert "\n" not in text and "\r" not in text and "\u2028" not in text
    assert "<" not in escape.html(label) and "<" not in escape.tex(label)
    assert escape.mpl(label).count("$") == escape.mpl(label).count("\\$")


def test_a_link_planted_where_a_report_file_goes_is_replaced_not_followed(
        tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("report.md", "report.html", "summary.csv", "tok_s_vs_budget_greedy.png"):
        (out / name).symlink_to(outside)
    build_report(Results.load(RECORDED), out)
    assert outside.read_text() == "keep me"
    for name in ("report.md", "report.html", "summary.csv", "tok_s_vs_budget_greedy.png"):
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0
    assert [p.name for p in out.iterdir() if p.name.startswith(".report-")] == []


def test_a_report_that_cannot_be_written_leaves_no_half_and_says_where(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").mkdir()  # a folder where a report file goes
    with pytest.raises(DeployError) as info:
        build_report(Results.load(RECORDED), out)
    assert str(out / "report.md") in str(info.value)
    assert [p.name for p in out.iterdir() if p.name.startswith(".report-")] == []
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DeployError) as info:
        build_report(Results.load(RECORDED), blocker / "sub")
    assert str(blocker / "sub") in str(info.value)


# (case id, --out value, fragment of the refusal; exit 2)
OUT_CASES = [("empty", "", "expected a folder name"), ("blank", "  ", "expected a folder name"),
             ("a-file", "FILE", "is a file, expected a folder")]


@pytest.mark.parametrize(("case", "value", "fragment"), OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_out_is_checked_before_the_work(tmp_path: Path, case: str, value: str,
                                        fragment: str) -> None:
    (tmp_path / "FILE").write_text("x")
    given = str(tmp_path / value) if value == "FILE" else value
    with pytest.raises(DeployError) as info:
        out_folder(given, tmp_path / "default")
    assert info.value.exit_code == ExitCode.USAGE
    assert fragment in str(info.value)
    assert out_folder(None, tmp_path / "default") == tmp_path / "default"


def test_an_unwritable_report_folder_is_one_clear_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user without write permission there (root cannot be refused, so it is simulated
    where the folder is first written: the private staging folder)."""
    def refused(**kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", str(kwargs.get("dir")))

    monkeypatch.setattr("ddtree_deploy.bench.report.tempfile.mkdtemp", refused)
    out = tmp_path / "out"
    with pytest.raises(DeployError) as info:
        build_report(Results.load(RECORDED), out)
    assert info.value.exit_code == ExitCode.FAILED
    assert str(out) in str(info.value) and "Permission denied" in str(info.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "fast", True, [1.0], 1e300])
def test_what_bench_writes_bench_report_reads(tmp_path: Path, value: Any) -> None:
    """A broken host's answer (NaN tok/s, a negative time) is kept out of the file, and said."""
    res = Results.open(tmp_path / "results.json", host="h", service="s")
    res.set_config("dflash", {"config": {"key": "dflash", "name": "dflash",
                                          "algorithm": "dflash"}})
    res.add_cell(("dflash", "code", 1, "greedy", 0), {"output_tok_s": value, "tokens": 5}, [])
    res.save()
    again = Results.load(res.path)
    cell = again.cells[0]
    assert cell["metrics"]["output_tok_s"] is None and cell["metrics"]["tokens"] == 5
    assert any("output_tok_s" in e and "dropped" in e for e in cell["errors"])
