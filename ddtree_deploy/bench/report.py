"""`bench report`: Markdown, an HTML page and a LaTeX table from a results file, with charts.

Every chart is a PNG with the CSV of exactly what it plots beside it (same name, .csv). The
tables, the charts and the recommendation read the same folded rows (summary.py). Text from
the results (labels, flags, host names) is escaped for HTML and LaTeX, never interpreted.
"""

from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_deploy.bench import charts
from ddtree_deploy.bench.recommend import Choice, NoDflash, recommend
from ddtree_deploy.bench.results import Results
from ddtree_deploy.bench.summary import Row, axes, fold
from ddtree_deploy.errors import DeployError

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


def _write(path: Path, text: str, report: Report) -> None:
    path.write_text(text, encoding="utf-8")
    report.files.append(path)


def _csv(rows: list[dict[str, Any]], fields: tuple[str, ...]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else r.get(k) for k in fields})
    return buf.getvalue()


def _choice_text(c: Choice | None) -> str:
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
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(map(cell, header)) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in body]
    return "\n".join(lines)


def _tex(text: str) -> str:
    for a, b in (("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("$", "\\$"),
                 ("#", "\\#"), ("_", "\\_"), ("{", "\\{"), ("}", "\\}"), ("~", "\\~{}"),
                 ("^", "\\^{}")):
        text = text.replace(a, b) if a != "\\" else text.replace(a, "\x00")
    return text.replace("\x00", "\\textbackslash{}")


def build_report(results: Results, out_dir: Path) -> Report:
    rows = fold(results)
    if not rows:
        raise DeployError(f"{results.path} has no measured cells yet")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(out_dir)
    try:
        rec = recommend(rows)
        report.recommendation = {"overall": rec["overall"].to_json() if rec["overall"] else None,
                                 "workloads": {w: c.to_json() for w, c in
                                               rec["workloads"].items()}}
    except NoDflash as exc:
        rec = None
        report.recommendation = {"error": str(exc)}
    images = _charts(rows, out_dir, report)
    _write(out_dir / "summary.csv", _csv([r.to_json() for r in rows],
                                         tuple(rows[0].to_json())), report)
    _write(out_dir / "report.md", _markdown(results, rows, rec, images), report)
    _write(out_dir / "report.html", _html(results, rows, rec, images), report)
    _write(out_dir / "report.tex", _latex(results, rows), report)
    return report


def _charts(rows: list[Row], out_dir: Path, report: Report) -> list[tuple[str, str]]:
    import matplotlib.pyplot as plt

    _, _, samplings = axes(rows)
    images = []
    for s in samplings:
        for make in charts.CHARTS:
            fig, plotted = make(rows, s)
            name = plotted[0]["chart"] if plotted else f"{make.__name__}_{s}"
            png = out_dir / f"{name}.png"
            try:
                fig.savefig(png, dpi=110)
            finally:
                plt.close(fig)
            report.files.append(png)
            _write(out_dir / f"{name}.csv", _csv(plotted, charts.CSV_FIELDS), report)
            report.charts[name] = plotted
            images.append((name, png.name))
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
    lines = ["**MIXED STACKS**: these configurations did not all run on the same software"]
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
    label = results.data.get("label")
    parts = ["# DDTree bench report", ""]
    if results.data.get("synthetic"):
        parts += ["**SYNTHETIC numbers** (no real model served them): " + str(label), ""]
    elif label:
        parts += [f"Note: {label}", ""]
    parts += [f"- {line}" for line in _facts_lines(results)]
    grid = results.data.get("grid") or {}
    parts += [f"- grid: {grid.get('source', '?')}, {grid.get('requests', '?')} requests per "
              f"cell, {grid.get('max_new_tokens', '?')} new tokens each, prompts as "
              f"{grid.get('prompts', '?')}", "", "## Recommendation", ""]
    if rec is None:
        parts.append("No DFlash measurement: nothing to compare with.")
    else:
        parts.append(f"- overall: {_choice_text(rec['overall'])}")
        parts += [f"- {w}: {_choice_text(c)}" for w, c in rec["workloads"].items()]
    for title, header, body in _tables(rows):
        parts += ["", f"## Results: {title}", "", _md_table(header, body)]
    parts += ["", "## Charts", ""]
    parts += [f"![{name}]({png}) (data: [{name}.csv]({name}.csv))" for name, png in images]
    parts += ["", "## Exact server flags", ""]
    parts += [f"- `{key}`: `{flags}`" for key, flags in _flags(results)]
    return "\n".join(parts) + "\n"


def _html(results: Results, rows: list[Row], rec: dict[str, Any] | None,
          images: list[tuple[str, str]]) -> str:
    e = html.escape
    body = ["<h1>DDTree bench report</h1>"]
    if results.data.get("synthetic"):
        body.append(f"<p><strong>SYNTHETIC numbers</strong> (no real model served them): "
                    f"{e(str(results.data.get('label')))}</p>")
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
    out = ["% DDTree bench report: tables (LaTeX, booktabs)"]
    if results.data.get("synthetic"):
        out.append(f"% SYNTHETIC numbers: {_tex(str(results.data.get('label')))}")
    for title, header, body in _tables(rows):
        out += ["\\begin{table}[ht]\\centering\\small",
                f"\\caption{{{_tex(title)}}}",
                "\\begin{tabular}{lll" + "r" * (len(header) - 3) + "}", "\\toprule",
                " & ".join(_tex(h) for h in header) + " \\\\", "\\midrule"]
        out += [" & ".join(_tex(c) for c in row) + " \\\\" for row in body]
        out += ["\\bottomrule", "\\end{tabular}", "\\end{table}", ""]
    return "\n".join(out) + "\n"
