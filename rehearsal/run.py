"""The GPU rehearsal, run on the GPU host from the repository root (one device call).

    python3 -m rehearsal.run --carry .carry --out OUT [--phase correctness,perf] [--budget 540]

``--phase`` takes one phase or several, comma-separated (``rehearsal.phases``): one install, one
payload deploy and one start of the union of their servers, then each phase's checks in turn.

1. installs the carry set (``rehearsal.carry install``) into the host's venv;
2. writes the hand-set test models (``rehearsal.models``) and config-only dummy models;
3. runs the tool's own commands against the real stack and records their exit codes
   (inventory, doctor, payload deploy / verify / rollback / status);
4. renders a unit per server with ``service render localhost NAME`` from a localhost hosts file,
   starts each as a plain process from the unit's command line and environment
   (several small servers on the one GPU), and waits for the tool's ``probe`` to call it healthy;
5. checks (correctness) or measures (perf) them, stops them, and writes OUT/rehearsal.json (its
   schema: ``rehearsal/result.py``) and OUT/logs.tar.gz (every server's log, the tool's output).

Everything is bounded by ``--budget`` seconds (a device call is cut at 600 s): a phase that no
longer fits is recorded as skipped, and the JSON and the archive are rewritten after every step,
so whatever ran comes back even if the call is cut.
"""


from __future__ import annotations

import argparse
import shutil
from dataclasses import replace
from functools import partial
from pathlib import Path

from rehearsal import perf8b
from rehearsal.harness import VENV, WORK, Rehearsal
from rehearsal.lineup import EAGER_ROUND, _old_payload, _servers
from rehearsal.run_phases import bench, correctness, dflash_sampled, graph_use, perf

__all__ = ["EAGER_ROUND", "_servers", "check_args", "graph_use", "main"]  # for the tests



# Seconds a phase that starts servers needs before it measures anything: install, models and
# the payload deploy (~75 s), a start group (10 cold servers were all up by 207 s in run 8; run
# 9's two groups took 296 s) and the probe's margin (100 s).
SETUP_S, GROUP_S, MARGIN_S = 75, 210, 100
MIN_SERVER_BUDGET = SETUP_S + GROUP_S + MARGIN_S  # one start group (--warm 0)


def min_budget(groups: int) -> int:
    """A second start group (``--warm N``) mostly finds warm JIT caches: ~half a cold group."""
    return MIN_SERVER_BUDGET + (GROUP_S // 2) * max(0, groups - 1)


def check_args(a: argparse.Namespace) -> str | None:
    """What is wrong with the options, found before anything runs (None: nothing)."""
    from rehearsal import phases as ph

    named = ph.parse(a.phase)
    if isinstance(named, str):
        return named
    if a.rounds < 1:
        return f"--rounds must be at least 1, got {a.rounds}"
    kinds = [k for k in a.bench_runs.split(",") if k]
    if "bench" in named and (not kinds or any(k not in ("ladder", "dummy") for k in kinds)
                             or len(set(kinds)) != len(kinds)):
        return f"--bench-runs: distinct names among ladder and dummy, got {a.bench_runs!r}"
    servers = ph.union(named, partial(_servers, sglang=getattr(a, "sglang", "0.5.11")))
    if isinstance(servers, str):
        return servers
    if not servers:
        return None
    wanted = [n for n in a.only.split(",") if n]
    unknown = sorted(set(wanted) - {s.name for s in servers})
    if unknown:
        return f"--only: no such server in phase {a.phase}: {', '.join(unknown)}"
    started = [s for s in servers if not wanted or s.name in wanted]
    groups = 2 if 0 < a.warm < len(started) else 1
    need = min_budget(groups)
    if a.budget < need:
        # run 11: 265 s left each server's probe 42 s after install, models and the payload
        # deploy, while a cold start takes 105-207 s: nothing was measured
        return (f"--budget {a.budget:g}: phase {a.phase} with {len(started)} servers in "
                f"{groups} start group(s) needs at least {need} s (setup ~{SETUP_S} s, a cold "
                f"start group up to ~{GROUP_S} s, the probe's margin {MARGIN_S} s)")
    if a.no_prewarm and any(s.algorithm == "dflash" and s.tool_probe for s in started):
        return ("--no-prewarm: a DFLASH server probed by the tool sends a sampled request, "
                "which would pay sgl-kernel's first top_k_renorm_prob (~100 s) inside its probe")
    return None



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rehearsal.run")
    ap.add_argument("--carry", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--phase", default="correctness",
                    help="one phase or several, comma-separated (one install and one start of "
                         "their servers): correctness, request-params, perf, perf-8b, "
                         "dflash-sampled, bench")
    ap.add_argument("--budget", type=float, default=540.0)
    ap.add_argument("--skip-checks", action="store_true",
                    help="perf: timings only (DFLASH's checks and the sampling laws ran before)")
    ap.add_argument("--warm", type=int, default=2,
                    help="servers started before the others (they fill the JIT caches)")
    ap.add_argument("--profile", action="store_true",
                    help="perf: profile one request per server first (rehearsal/profile.py)")
    ap.add_argument("--only", default="",
                    help="correctness/perf: start only these servers (comma-separated names)")
    ap.add_argument("--rounds", type=int, default=3, help="perf: alternating rounds")
    ap.add_argument("--bench-runs", default="ladder,dummy",
                    help="bench: the deployments to sweep, in order (ladder, dummy)")
    ap.add_argument("--bench-resume", action="store_true",
                    help="bench: resume from the results committed under benchmarks/results/bench")
    ap.add_argument("--no-prewarm", action="store_true",
                    help="skip the sampling prewarm (only DFLASH's sampled verify needs it)")
    ap.add_argument("--sglang", default="0.5.11",
                    help="the carry set's SGLang: 0.5.11 (the patch set) or 0.5.17 (the plugin "
                         "form: payload deploy installs ddtree-sglang-plugin)")
    ap.add_argument("--keep-payload", action="store_true",
                    help="leave the payload deployed at the end (a next call on a warm machine)")
    a = ap.parse_args(argv)
    problem = check_args(a)
    if problem:
        ap.error(problem)
    a.out.mkdir(parents=True, exist_ok=True)
    # A warm machine keeps HOME's JIT caches from the call before (a start takes ~55 s warm,
    # ~105 s cold); everything else is made anew.
    for old in WORK.iterdir() if WORK.is_dir() else ():
        if old.name != "home":
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    (WORK / "logs").mkdir(parents=True)
    r = Rehearsal(a.carry, a.out, a.budget, a.phase)
    r.skip_checks = a.skip_checks
    r.profile = a.profile
    r.rounds = a.rounds
    hosts: Path | None = None
    from rehearsal import phases

    named = phases.parse(a.phase)
    assert not isinstance(named, str)  # checked by check_args
    try:
        r.step("install", r.install)
        r.step("models", r.models)
        servers_of = partial(_servers, sglang=a.sglang)
        shared = phases.union(named, servers_of)
        assert not isinstance(shared, str)  # checked by check_args
        if a.only:  # names checked by check_args
            wanted = {n for n in a.only.split(",") if n}
            shared = [s for s in shared if s.name in wanted]
        shared = [replace(s, sglang=a.sglang) for s in shared]
        r.result["sglang"] = r.sglang = a.sglang
        from rehearsal.servers import Server, hosts_file

        hosts = hosts_file(shared[0] if shared else Server("tool", str(WORK / "models/ladder"),
                                                           port=31099), str(VENV), r.logs)
        warm = None if a.no_prewarm else r.prewarm()
        snapshot = _old_payload(a.sglang)
        if perf8b.PHASE in named and snapshot is not None:  # before the payload is deployed
            r.step("old payload", lambda: perf8b.prepare_old(r, VENV, WORK, hosts, snapshot))
            if not r.result["steps"]["old payload"]["ok"]:
                shared = [s for s in shared if s.venv is None]
        if named != ("dflash-sampled",):
            r.step("payload deploy", lambda: r.deploy_payload(hosts))
        if shared:  # servers take longer to start than the prewarm has left to run
            def meanwhile() -> None:  # while the servers start
                r.facts_commands(hosts)
                if {"correctness", "perf"} & set(named) and a.sglang == "0.5.11":
                    r.step("round graphs", r.graphs_check, need=60)  # the patch set's modules

            r.step("servers", lambda: r.start_servers(shared, warm=a.warm,
                                                      meanwhile=meanwhile), need=150)
        r.step("prewarm", lambda: r.prewarm_done(warm))
        for phase in named:
            own = {s.name for s in servers_of(phase)}
            mine = [s for s in shared if s.name in own]
            if phase == "correctness":
                correctness(r, mine)
            elif phase == "request-params":
                from rehearsal import request_params

                r.step("request-params", partial(request_params.run_phase, r, mine, WORK),
                       need=60)
            elif phase == "perf":
                perf(r, mine)
            elif phase == perf8b.PHASE:
                perf8b.run_phase(r, mine, WORK / "profiles-8b")
            elif phase == "dflash-sampled" and mine:
                dflash_sampled(r, mine[0])
            elif phase == "bench":
                r.stop_all()  # bench starts its own servers, one at a time
                r.step("bench", lambda: bench(r, tuple(k for k in a.bench_runs.split(",") if k),
                                              resume=a.bench_resume), need=120)
    finally:
        r.stop_all()
        r.result["checks"]["round-graphs/servers"] = graph_use(r.logs)
        r.save()
    if hosts is not None and named != ("dflash-sampled",) and not a.keep_payload:
        r.step("payload rollback", lambda: r.rollback_commands(hosts))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
