"""`bench report`: Markdown, an HTML page and a LaTeX table from a results file, with charts.

Every chart is a PNG with the CSV of exactly what it plots beside it (same name, .csv). The
tables, the charts and the recommendation read the same folded rows (summary.py). Text from
the results (labels, flags, host names) is escaped for Markdown, HTML, LaTeX and matplotlib
(`bench/escape.py`), never interpreted.

The files are made in a fresh private folder inside the output folder, then each renamed
into place: a link planted where a report file goes is replaced, never followed, and a
failure leaves the earlier report as it was (and no half-written file).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_deploy.bench import charts, escape
from ddtree_deploy.bench.recommend import Choice, NoDflash, recommend
from ddtree_deploy.bench.results import Results
from ddtree_deploy.bench.summary import Row, axes, fold
from ddtree_deploy.errors import DeployError, UsageError

COLUMNS = (("output_tok_s", "tok/s", 1), ("accept_length", "accept", 2),
           ("ttft_p50_s", "TTFT p50 ms", 1000), ("tpot_p50_s", "TPOT p50 ms", 1000),
           ("icl_p50_s", "ICL p50 ms", 1000), ("icl_p99_s", "ICL p99 ms", 1000))


@dataclass
class Report:
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    charts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    recommendation: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"out_dir": str(self.out_dir), "files": [str(f) for f in self.files],
                "recommendation": self.recommendation}


def _fmt(value: Any, scale: float) -> str:
    if value is None:
        return "-"
    if scale == 1000:
        return f"{value * 1000:.1f}"
    return f"{value:.{int(scale)}f}" if scale in (1, 2) else str(value)


class _Staging:
    """A fresh folder (mode 0700) inside the output folder; files created there exclusively,
    without following links, then renamed over their final names."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.names: list[str] = []
        try:
            self.dir = Path(tempfile.mkdtemp(prefix=".report-", dir=out_dir))
        except OSError as exc:
            raise DeployError(f"cannot write the report into {out_dir}: "
                              f"{exc.strerror or exc}") from None

    def open(self, name: str) -> Any:
        fd = os.open(self.dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
        self.names.append(name)
        return os.fdopen(fd, "wb")

    def commit(self) -> list[Path]:
        done = []
        for name in self.names:
            target = self.out_dir / name
            try:
                os.replace(self.dir / name, target)
            except OSError as exc:
                raise DeployError(f"cannot write {target}: {exc.strerror or exc}") from None
            done.append(target)
        return done

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _write(stage: _Staging, name: str, text: str, report: Report) -> None:
    with stage.open(name) as fh:
        fh.write(text.encode("utf-8"))
    report.files.append(stage.out_dir / name)


def out_folder(value: str | None, default: Path) -> Path:
    """`--out DIR` checked before any work: an empty name or an existing file is exit 2."""
    if value is None:
        return default
    if not value.strip():
        raise UsageError(f"--out {value!r}: expected a folder name")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {value}: is a file, expected a folder (it is created if it "
                         "does not exist)")
    return path


def _csv(rows: list[dict[str, Any]], fields: tuple[str, ...]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else escape.csv_cell(r.get(k)) for k in fields})
    return buf.getvalue()


def _choice_text(c: Choice | None) -> str:
    """Plain text: each format escapes it as a whole."""
    if c is None:
        return "no configuration was measured in every cell without failures"
    noise = " (within the spread across repeats: not a clear win)" if c.within_noise else ""
    return (f"{c.name} ({c.config}): {c.margin * 100:+.1f}% tok/s over DFlash (geometric mean "
            f"of {c.cells} cells), spread across repeats {c.spread * 100:.1f}%{noise}")


def _tables(rows: list[Row]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per sampling mode: (title, header, body) with one line per config x workload x conc."""
    _, _, samplings = axes(rows)
    out = []
    for s in samplings:
        header = ["configuration", "workload", "conc.", *[c[1] for c in COLUMNS], "repeats",
                  "spread %", "failed"]
        body = [[r.name, r.workload, str(r.concurrency),
                 *[_fmt(r.values.get(k), scale) for k, _, scale in COLUMNS], str(r.repeats),
                 "-" if r.spread is None else f"{r.spread * 100:.1f}", str(r.failed)]
                for r in rows if r.sampling == s]
        out.append((f"{s} requests", header, body))
    return out


def _md_table(header: list[str], body: list[list[str]]) -> str:
    cell = escape.md
    lines = ["| " + " | ".join(map(cell, header)) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in body]
    return "\n".join(lines)


def build_report(results: Results, out_dir: Path) -> Report:
    rows = fold(results)
    if not rows:
        raise DeployError(f"{results.path} has no measured cells yet")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{out_dir}: is a file, expected a folder for the report") from None
    except OSError as exc:
        raise DeployError(f"cannot make the report folder {out_dir}: "
                          f"{exc.strerror or exc}") from None
    report = Report(out_dir)
    try:
        rec = recommend(rows)
        report.recommendation = {"overall": rec["overall"].to_json() if rec["overall"] else None,
                                 "workloads": {w: c.to_json() for w, c in
                                               rec["workloads"].items()}}
    except NoDflash as exc:
        rec = None
        report.recommendation = {"error": str(exc)}
    stage = _Staging(out_dir)
    try:
        images = _charts(rows, stage, report)
        _write(stage, "summary.csv", _csv([r.to_json() for r in rows],
                                          tuple(rows[0].to_json())), report)
        _write(stage, "report.md", _markdown(results, rows, rec, images), report)
        _write(stage, "report.html", _html(results, rows, rec, images), report)
        _write(stage, "report.tex", _latex(results, rows), report)
        stage.commit()
    except OSError as exc:
        raise DeployError(f"cannot write the report into {out_dir}: "
                          f"{exc.strerror or exc}") from None
    finally:
        stage.discard()
    return report


def _charts(rows: list[Row], stage: _Staging, report: Report) -> list[tuple[str, str]]:
    import matplotlib.pyplot as plt

    _, _, samplings = axes(rows)
    images = []
    for s in samplings:
        for make in charts.CHARTS:
            with warnings.catch_warnings():  # a workload named in a script the font lacks
                warnings.filterwarnings("ignore", message="Glyph .* missing from")
                fig, plotted = make(rows, s)
            name = plotted[0]["chart"] if plotted else f"{make.__name__}_{s}"
            try:
                with stage.open(f"{name}.png") as fh, warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Glyph .* missing from")
                    fig.savefig(fh, dpi=110, format="png")
            finally:
                plt.close(fig)
            report.files.append(stage.out_dir / f"{name}.png")
            _write(stage, f"{name}.csv", _csv(plotted, charts.CSV_FIELDS), report)
            report.charts[name] = plotted
            images.append((name, f"{name}.png"))
    return images


def _facts_lines(results: Results) -> list[str]:
    f = results.data.get("host_facts") or {}
    gpus = ", ".join(f"{g.get('name')} ({g.get('memory_total_mib')} MiB)"
                     for g in f.get("gpus") or []) or "none recorded"
    return [f"host {results.data.get('host')} ({f.get('hostname') or '?'}), service "
            f"{results.data.get('service')}",
            f"GPU: {gpus}; driver {f.get('driver_version') or '?'}, CUDA "
            f"{f.get('cuda_version') or '?'}, lane {f.get('lane') or '?'}",
            f"torch {f.get('torch') or '?'}, sglang {f.get('sglang') or '?'}, payload "
            f"{f.get('payload') or '-'}, python {f.get('python') or '?'}", *_mixed(results)]


def _mixed(results: Results) -> list[str]:
    """A line per configuration when they did not all run on one stack (`--mixed-stack`)."""
    stacks = results.stacks()
    if len({json.dumps(v, sort_keys=True) for v in stacks.values()}) <= 1 and not \
            results.data.get("facts_history"):
        return []
    lines = ["MIXED STACKS: these configurations did not all run on the same software"]
    for key in results.configs:
        st = stacks.get(key)
        lines.append(f"{key}: " + ("stack not recorded" if st is None else
                                   f"payload {st.get('payload') or '-'}, sglang "
                                   f"{st.get('sglang') or '?'}, torch {st.get('torch') or '?'}, "
                                   f"driver {st.get('driver_version') or '?'}, host "
                                   f"{st.get('hostname') or '?'}"))
    return lines


def _flags(results: Results) -> list[tuple[str, str]]:
    return [(key, " ".join(info.get("flags") or [])
             + (f"  [not healthy: {info['error']}]" if info.get("error") else ""))
            for key, info in results.configs.items()]


def _markdown(results: Results, rows: list[Row], rec: dict[str, Any] | None,
              images: list[tuple[str, str]]) -> str:
    md = escape.md
    label = results.data.get("label")
    parts = ["# DDTree bench report", ""]
    if results.data.get("synthetic"):
        parts += ["**SYNTHETIC numbers** (no real model served them): " + md(str(label)), ""]
    elif label:
        parts += [f"Note: {md(label)}", ""]
    parts += [f"- {md(line)}" for line in _facts_lines(results)]
    grid = results.data.get("grid") or {}
    parts += ["- " + md(f"grid: {grid.get('source', '?')}, {grid.get('requests', '?')} requests "
                        f"per cell, {grid.get('max_new_tokens', '?')} new tokens each, prompts "
                        f"as {grid.get('prompts', '?')}"), "", "## Recommendation", ""]
    if rec is None:
        parts.append("No DFlash measurement: nothing to compare with.")
    else:
        parts.append(f"- overall: {md(_choice_text(rec['overall']))}")
        parts += [f"- {md(w)}: {md(_choice_text(c))}" for w, c in rec["workloads"].items()]
    for title, header, body in _tables(rows):
        parts += ["", f"## Results: {md(title)}", "", _md_table(header, body)]
    parts += ["", "## Charts", ""]
    # chart names are made here from validated values (e.g. tok_s_vs_budget_greedy)
    parts += [f"![{name}]({png}) (data: [{name}.csv]({name}.csv))" for name, png in images]
    parts += ["", "## Exact server flags", ""]
    parts += [f"- {escape.md_code(key)}: {escape.md_code(flags)}"
              for key, flags in _flags(results)]
    return "\n".join(parts) + "\n"


def _html(results: Results, rows: list[Row], rec: dict[str, Any] | None,
          images: list[tuple[str, str]]) -> str:
    e = escape.html
    body = ["<h1>DDTree bench report</h1>"]
    if results.data.get("synthetic"):
        body.append(f"<p><strong>SYNTHETIC numbers</strong> (no real model served them): "
                    f"{e(str(results.data.get('label')))}</p>")
    elif results.data.get("label"):
        body.append(f"<p>Note: {e(results.data['label'])}</p>")
    body.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in _facts_lines(results)) + "</ul>")
    body.append("<h2>Recommendation</h2><ul>")
    if rec is None:
        body.append("<li>No DFlash measurement: nothing to compare with.</li>")
    else:
        body.append(f"<li>overall: {e(_choice_text(rec['overall']))}</li>")
        body += [f"<li>{e(w)}: {e(_choice_text(c))}</li>" for w, c in rec["workloads"].items()]
    body.append("</ul>")
    for title, header, rows_ in _tables(rows):
        body.append(f"<h2>Results: {e(title)}</h2><table><tr>"
                    + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        body += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows_]
        body.append("</table>")
    body.append("<h2>Charts</h2>")
    body += [f'<figure><img src="{e(png)}" alt="{e(name)}"><figcaption>{e(name)} '
             f'(<a href="{e(name)}.csv">data</a>)</figcaption></figure>' for name, png in images]
    body.append("<h2>Exact server flags</h2><ul>")
    body += [f"<li><code>{e(k)}</code>: <code>{e(f)}</code></li>" for k, f in _flags(results)]
    body.append("</ul>")
    style = ("body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:"
             "collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
             "img{max-width:100%}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>DDTree bench report"
            f"</title><style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def _latex(results: Results, rows: list[Row]) -> str:
    tex = escape.tex
    out = ["% DDTree bench report: tables (LaTeX, booktabs)"]
    if results.data.get("synthetic"):
        # escape.tex shows a newline as \x0a: nothing after it can leave the comment
        out.append(f"% SYNTHETIC numbers: {tex(str(results.data.get('label')))}")
    for title, header, body in _tables(rows):
        out += ["\\begin{table}[ht]\\centering\\small",
                f"\\caption{{{tex(title)}}}",
                "\\begin{tabular}{lll" + "r" * (len(header) - 3) + "}", "\\toprule",
                " & ".join(tex(h) for h in header) + " \\\\", "\\midrule"]
        out += [" & ".join(tex(c) for c in row) + " \\\\" for row in body]
        out += ["\\bottomrule", "\\end{tabular}", "\\end{table}", ""]
    return "\n".join(out) + "\n"
