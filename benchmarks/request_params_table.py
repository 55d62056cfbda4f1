"""RESULTS.md's request-parameter table (issue 25) from a rehearsal's JSON.

    python benchmarks/request_params_table.py OUT/rehearsal.json [--label "call 2"]

Prints Markdown: one row per check, one column per server of the phase (rehearsal/
request_params.py), each cell ``pass``/``FAIL`` with the numbers behind it; a check that did not
run reads ``unrun``. Then the verdict. Synthetic model (the ladder design): the label says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

SERVERS = ("rp-nospec", "rp-dflash", "rp-ddtree15", "rp-ddtree31-nograph",
           "rp-ddtree15-topkfault", "rp-ddtree15-penaltyfault")
CHECKS = ("refusals", "greedy", "topk-mix", "penalty", "multiturn", "abort", "parallel-n", "leaks")


def _detail(check: str, v: Mapping[str, Any]) -> str:
    if "error" in v:
        return str(v["error"])[:60].replace("|", "/")
    if check == "refusals":
        rows = v.get("rows", {})
        routes = [(r, k) for r in rows.values() for k in r if k != "neutral"]
        refused = sum(1 for r, k in routes if r[k].get("status") == 400 and r[k].get("named"))
        return f"{refused}/{len(routes)} refused naming it"
    if check in ("greedy", "parallel-n"):
        if "wrong_count" not in v:  # call 1 kept the first 10 only
            listed = len(v.get("wrong", []))
            return f"{listed}{'+' if listed == 10 else ''} of {v.get('requests', 0)} differ"
        return f"{v['requests'] - v['wrong_count']}/{v['requests']} equal"
    if check == "topk-mix":
        k2 = v.get("top_k 2", {})
        outside = sum(r.get("outside", 0) for r in v.values() if isinstance(r, Mapping))
        z = max((abs(r.get("z", 0.0)) for r in v.values() if isinstance(r, Mapping)),
                default=0.0)
        return f"{outside} outside of {k2.get('transitions', 0)}+; max abs z {z:.1f}"
    if check == "penalty":
        return (f"{v.get('refused', 0)} refused, {v.get('served_wrong', 0)} served wrong"
                + (f", {v['failed']} failed" if v.get("failed") else ""))
    if check == "multiturn":
        return f"{len(v.get('turns', []))} conversations"
    if check == "abort":
        return f"cuts {v.get('chunks_before_cut')}, after {v.get('after_status')}"
    if check == "leaks":
        return "alive" if v.get("alive") else "DEAD" + (f", {v['found']}" if v.get("found")
                                                       else "")
    return ""


def table(result: Mapping[str, Any], label: str = "") -> str:
    checks = result.get("checks", {})
    ran = isinstance(checks.get("request-params/verdict"), Mapping)
    head = "| check | " + " | ".join(SERVERS) + " |"
    lines = [f"Synthetic model (ladder design){', ' + label if label else ''}.", "", head,
             "|---" * (len(SERVERS) + 1) + "|"]
    for check in CHECKS:
        cells = []
        for server in SERVERS:
            v = checks.get(f"request-params/{server}/{check}")
            if not isinstance(v, Mapping):  # the reference answers the others' checks
                cells.append("reference" if ran and server == SERVERS[0] else "unrun")
                continue
            cells.append(f"{'pass' if v.get('ok') else 'FAIL'}: {_detail(check, v)}")
        lines.append(f"| {check} | " + " | ".join(cells) + " |")
    verdict = checks.get("request-params/verdict")
    lines += ["", "verdict: " + ("unrun" if not isinstance(verdict, Mapping) else
                                 f"{'PASS' if verdict.get('ok') else 'FAIL'} "
                                 f"(controls failed: {verdict.get('controls_failed')}, "
                                 f"DFLASH anchor: {verdict.get('anchor')})")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="request_params_table.py")
    ap.add_argument("result")
    ap.add_argument("--label", default="")
    a = ap.parse_args(argv)
    try:
        with open(a.result, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"{a.result}: {exc}", file=sys.stderr)
        return 2
    print(table(doc, a.label))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
