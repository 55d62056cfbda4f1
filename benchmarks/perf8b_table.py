"""The tables of RESULTS.md's issue-28 section from a rehearsal's JSON (phase perf-8b).

    python benchmarks/perf8b_table.py OUT/rehearsal.json [--label "run P1"]

Prints Markdown: per server and batch the round's cost (ms; a step without speculation) with
its ratio to the no-spec step of the same batch, and tok/s with its ratio to DFLASH's; then the
per-round profile (batch 1). A cell that did not run reads ``unrun``. Synthetic models (dummy
weights): the label says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

# -old: the patch set's earlier payload (0.5.11); on SGLang 0.5.17+ the plugin form's own A/B
# switches (rehearsal/perf8b.py: PLUGIN_BEFORE, PLUGIN_AFTER), said for each server in PLUGIN_AB
ORDER = ("nospec-8b", "dflash-8b", "ddtree15-8b-old", "ddtree15-8b-prev", "ddtree15-8b-extendattn",
         "ddtree15-8b-eagerverify", "ddtree15-8b", "ddtree31-8b")
BATCHES = (1, 8, 32)
PLUGIN_AB = {
    "ddtree15-8b-prev": "both verify changes off, as before them "
                        "(SGLANG_DDTREE_VERIFY_GRAPH=0, SGLANG_DDTREE_TREE_ATTENTION=0: the "
                        "target's verify eager, SGLang's extend kernel)",
    "ddtree15-8b-extendattn": "the verify graphs without the tree kernel "
                              "(SGLANG_DDTREE_VERIFY_GRAPH=1, SGLANG_DDTREE_TREE_ATTENTION=0)",
    "ddtree15-8b-eagerverify": "the tree kernel without the verify graphs "
                               "(SGLANG_DDTREE_TREE_ATTENTION=1, SGLANG_DDTREE_VERIFY_GRAPH=0)",
    "ddtree15-8b": "both on, named (SGLANG_DDTREE_TREE_ATTENTION=1, SGLANG_DDTREE_VERIFY_GRAPH=1: "
                   "the plugin's default from 0.3.4; ddtree31-8b too)",
}
NOSPEC, DFLASH = "nospec-8b", "dflash-8b"
PROFILE_COLS = (("round_ms", "round ms"), ("gpu_busy_ms", "GPU busy ms"),
                ("gpu_idle_ms", "GPU idle ms"), ("host_blocked_ms", "host blocked ms"),
                ("launches_per_round", "kernel launches"),
                ("graph_launches_per_round", "graph launches"),
                ("syncs_per_round", "host syncs"))


def _cell(batch: Mapping[str, Any] | None, key: str) -> float | None:
    value = (batch or {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def timing_table(timings: Mapping[str, Any]) -> str:
    names = [n for n in ORDER if n in timings] + sorted(set(timings) - set(ORDER))
    head = ["server"]
    for b in BATCHES:
        head += [f"bs {b} round ms (x no-spec)", f"bs {b} tok/s (x DFLASH)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        cells = [name]
        for b in BATCHES:
            got = timings.get(name, {}).get(f"batch{b}")
            ms, tok = _cell(got, "round_ms_median"), _cell(got, "tok_s_median")
            base = _cell(timings.get(NOSPEC, {}).get(f"batch{b}"), "round_ms_median")
            ref = _cell(timings.get(DFLASH, {}).get(f"batch{b}"), "tok_s_median")
            cells.append("unrun" if ms is None else
                         f"{ms:.2f}" + (f" ({ms / base:.2f}x)" if base else ""))
            cells.append("unrun" if tok is None else
                         f"{tok:.0f}" + (f" ({tok / ref:.2f}x)" if ref else ""))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def profile_table(profiles: Mapping[str, Any]) -> str:
    names = [n for n in ORDER if n in profiles] + sorted(set(profiles) - set(ORDER))
    rows = ["| server (bs 1, per round) | " + " | ".join(t for _, t in PROFILE_COLS) + " |",
            "|" + "---|" * (len(PROFILE_COLS) + 1)]
    for name in names:
        if name.endswith("/stack"):
            continue
        entry = profiles.get(name) or {}
        vals = [entry.get(k) for k, _ in PROFILE_COLS]
        rows.append("| " + " | ".join([name] + ["unrun" if not isinstance(v, int | float)
                                                 else f"{v:g}" for v in vals]) + " |")
    return "\n".join(rows)


def render(doc: Mapping[str, Any], label: str) -> str:
    p = doc.get("perf8b") or {}
    done = [b.get("rounds_done") for t in (p.get("timings") or {}).values()
            if isinstance(t, Mapping) and not t.get("failed")
            for b in t.values() if isinstance(b, Mapping) and "rounds_done" in b]
    rounds = p.get("rounds", "?")
    if done and min(done) != rounds:  # measure stopped early: the call's time ran short
        rounds = f"{min(done)} (of {rounds} asked)"
    parts = [f"**{label}** ({p.get('models', 'synthetic models')}; "
             f"{p.get('settings', '')}; {rounds} alternating rounds, "
             f"{p.get('tokens', '?')} new tokens a request, medians)"]
    if doc.get("sglang"):
        form = "the patch set" if doc["sglang"] == "0.5.11" else "the plugin"
        parts[0] += f"; SGLang {doc['sglang']} + {form}"
    if p.get("old_payload"):
        parts.append(f"`ddtree15-8b-old`: the payload of {p['old_payload']}")
    names = set(p.get("timings") or {}) | set(p.get("profiles") or {})
    plugin = doc.get("sglang") not in (None, "0.5.11")  # the plugin form's switches
    for name, what in PLUGIN_AB.items():
        if plugin and name in names:
            parts.append(f"`{name}`: {what}")
    for name, t in (p.get("timings") or {}).items():
        if isinstance(t, Mapping) and t.get("failed"):
            parts.append(f"`{name}`: stopped answering, not measured further "
                         f"({'; '.join(str(e) for e in t['failed'])[:200]})")
    parts.append(timing_table(p.get("timings") or {}))
    parts.append(profile_table(p.get("profiles") or {}))
    syncs = p.get("syncs") or {}
    if syncs:
        parts.append("Host syncs a round, limit " + str(p.get("sync_limit")) + ": " + ", ".join(
            f"{n} {v.get('syncs_per_round')} ({'ok' if v.get('ok') else 'FAIL'})"
            for n, v in syncs.items()))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/perf8b_table.py")
    ap.add_argument("result", help="a rehearsal's rehearsal.json")
    ap.add_argument("--label", default="perf-8b")
    a = ap.parse_args(argv)
    try:
        with open(a.result, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"perf8b_table: {a.result}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render(doc, a.label))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
