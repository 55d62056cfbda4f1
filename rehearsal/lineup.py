"""Which servers each rehearsal phase starts (``rehearsal.run``): names, models, algorithms,
budgets, faults and flags, on consecutive ports."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from rehearsal import perf8b
from rehearsal.harness import REPO, WORK

EAGER_ROUND = (("SGLANG_DDTREE_ROUND_GRAPHS", "0"),)  # the payload's round graphs off


def _old_payload(sglang: str) -> Path | None:
    """The carried earlier payload for perf-8b's A/B: the patch set's (0.5.11) only; the plugin
    form's A/B is its own switches (perf8b.PLUGIN_BEFORE)."""
    return perf8b.snapshot_dir(REPO) if sglang == "0.5.11" else None


def _servers(phase: str, sglang: str = "0.5.11") -> list[Any]:
    from rehearsal.servers import Server

    m = str(WORK / "models")
    lad, alarm, dummy = f"{m}/ladder", f"{m}/alarm", f"{m}/dummy"
    if phase == "dflash-sampled":
        specs = [Server("dflash-ladder", lad, "dflash")]
    elif phase == "correctness":
        specs = [
            Server("nospec-ladder", lad),
            Server("ddtree15-ladder", lad, "ddtree", 15, 8, backend=None),  # payload picks triton
            Server("dflash-ladder", lad, "dflash"),
            Server("ddtree31-ladder", lad, "ddtree", 31, 8),
            Server("ddtree63-ladder", lad, "ddtree", 63, 8),
            Server("ddtree15-ladder-nograph", lad, "ddtree", 15, 8, cuda_graph=False),
            Server("shadow15-ladder", lad, "ddtree", 15, 8, shadow_linear=True),
            Server("ddtree15-alarm", alarm, "ddtree", 15, 8),
            Server("ddtree15-alarm-maskfault", alarm, "ddtree", 15, 8, fault="mask"),
            Server("ddtree15-ladder-greedyfollow", lad, "ddtree", 15, 8, fault="greedy-follow"),
            Server("ddtree15-ladder-hot", lad, "ddtree", 15, 8, fault="hot"),
            Server("ddtree63-ladder-pressure", lad, "ddtree", 63, 8, context_length=2048,
                   extra=("--max-total-tokens", "6000")),
        ]
    elif phase == "request-params":
        from rehearsal import request_params

        specs = request_params.servers(m)
    elif phase == "bench":
        specs = []  # bench starts its own servers (bench())
    elif phase == perf8b.PHASE:
        old = str(WORK / "venv-old") if _old_payload(sglang) else None
        specs = perf8b.servers(f"{m}/q8b", old_venv=old, sglang=sglang)
    else:
        # DFLASH first: the warm group starts alone, so a first-use stall of DFLASH's sampled
        # verify (runs 2-3) overlaps the other servers' start.
        specs = [
            Server("dflash-ladder", lad, "dflash"),
            Server("ddtree15-ladder", lad, "ddtree", 15, 8),
            Server("nospec-ladder", lad),
            Server("ddtree31-ladder", lad, "ddtree", 31, 8),
            Server("nospec-dummy", dummy, dummy=True),
            Server("dflash-dummy", dummy, "dflash", dummy=True, tool_probe=False),
            Server("ddtree15-dummy", dummy, "ddtree", 15, 8, dummy=True),
            Server("ddtree31-dummy", dummy, "ddtree", 31, 8, dummy=True),
            # The same payload with its round graphs off (an A/B of one change, payload 0.2.2:
            # the plan and walk eager, as in 0.2.1).
            Server("ddtree15-ladder-eager", lad, "ddtree", 15, 8, env=EAGER_ROUND),
            Server("ddtree15-dummy-eager", dummy, "ddtree", 15, 8, dummy=True, env=EAGER_ROUND),
        ]
    if phase in ("correctness", "request-params"):  # the plugin's default, and one server off
        from rehearsal.servers import switched

        specs = switched(specs, sglang)
    # The tool renders --speculative-num-draft-tokens from each drafter's config.json (8 for the
    # designs, 16 for the dummy drafter; run 3's units show both).
    return [replace(s, port=31000 + i) for i, s in enumerate(specs)]

