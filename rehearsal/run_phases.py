"""What each rehearsal phase does with its started servers (``rehearsal.run`` starts them): the
correctness checks, the perf timings (profiles, sampled times, the sampling laws), bench's own
servers, DFLASH's sampled path, and which servers replayed the payload's round graphs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rehearsal.harness import REPO, VENV, WORK, Rehearsal, work_env


def correctness(r: Rehearsal, servers: list[Any]) -> None:
    from rehearsal import checks
    from rehearsal.designs import get_design

    lad, alarm = get_design("ladder"), get_design("alarm")
    port = {s.name: s.port for s in servers}
    mixed = checks.prompt_set(lad, 40, seed=1)

    def lossless(name: str, design: Any, prompts: Any, algo: str | None, budget: int = 15,
                 stream_every: int = 0) -> None:
        if not r.healthy(name):
            r.result["not_run"].append({"step": f"lossless {name}", "why": "server not healthy"})
            return
        res = checks.lossless(port[name], design, prompts, concurrency=40, algorithm=algo,
                              budget=budget, topk=8, stream_every=stream_every)
        res["max_running_req"] = checks.max_running(r.logs / f"{name}.log")
        res.pop("outputs")
        r.result["checks"][f"lossless/{name}"] = res

    jobs = [("nospec-ladder", lad, mixed, None, 15, 0),
            ("dflash-ladder", lad, mixed, "DFLASH", 15, 0),
            ("ddtree15-ladder", lad, mixed, "DDTREE", 15, 5),
            ("ddtree31-ladder", lad, mixed, "DDTREE", 31, 0),
            ("ddtree63-ladder", lad, mixed, "DDTREE", 63, 0),
            ("ddtree15-ladder-nograph", lad, mixed, "DDTREE", 15, 0),
            ("shadow15-ladder", lad, mixed, "DFLASH", 15, 0),
            ("ddtree15-alarm", alarm, checks.prompt_set(alarm, 40, seed=2), "DDTREE", 15, 0),
            ("ddtree15-alarm-maskfault", alarm, checks.prompt_set(alarm, 40, seed=2), "DDTREE",
             15, 0)]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        list(pool.map(lambda j: r.step(f"check {j[0]}", lambda: lossless(*j)), jobs))

    for name, algo, budget in (("dflash-ladder", "DFLASH", 15),
                               ("ddtree15-ladder", "DDTREE", 15),
                               ("ddtree31-ladder", "DDTREE", 31),
                               ("ddtree63-ladder", "DDTREE", 63)):
        if r.healthy(name):
            r.result["checks"][f"accept/{name}"] = checks.long_accept(port[name], lad, algo,
                                                                      budget, 8)

    def law() -> None:

        logits = checks.transition_logits(WORK / "models" / "ladder" / "target")
        t = checks.half_temperature(logits)
        for name in ("nospec-ladder", "ddtree15-ladder", "ddtree15-ladder-greedyfollow",
                     "ddtree15-ladder-hot"):
            if r.healthy(name):
                r.result["checks"][f"sampling/{name}"] = checks.sampling_law(
                    port[name], logits, temperature=t, count=64, length=48, seed=5)

    r.step("sampling law", law, need=30)

    def pressure() -> None:
        name = "ddtree63-ladder-pressure"
        if not r.healthy(name):
            return
        prompts = checks.prompt_set(lad, 24, seed=3, min_len=1700, max_len=1900, min_out=100,
                                    max_out=140)
        res = checks.lossless(port[name], lad, prompts, concurrency=24, algorithm="DDTREE",
                              budget=63, topk=8)
        res.pop("outputs")
        log = (r.logs / f"{name}.log").read_text(errors="replace")
        res["retractions_or_queue"] = log.count("retract") + log.count("#queue-req: ")
        res["draft_oom"] = "DFLASH draft OOM" in log
        res["alive_after"] = r.running[name].pid and os.path.exists(f"/proc/{r.running[name].pid}")
        r.result["checks"][f"pressure/{name}"] = res

    r.step("memory pressure", pressure, need=20)


def perf(r: Rehearsal, servers: list[Any]) -> None:
    from rehearsal import checks
    from rehearsal import perf as p
    from rehearsal.designs import get_design

    lad = get_design("ladder")
    port = {s.name: s.port for s in servers}

    def dflash_checks() -> None:  # DFLASH's own answers on the designed model (run 2 lacked)
        name = "dflash-ladder"
        if not r.healthy(name):
            return
        res = checks.lossless(port[name], lad, checks.prompt_set(lad, 40, seed=1),
                              concurrency=40, algorithm="DFLASH")
        res["max_running_req"] = checks.max_running(r.logs / f"{name}.log")
        res.pop("outputs")
        r.result["checks"][f"lossless/{name}"] = res
        r.result["checks"][f"accept/{name}"] = checks.long_accept(port[name], lad, "DFLASH",
                                                                 15, 8)

    if not r.skip_checks and "dflash-ladder" not in port:
        r.result["not_run"].append({"step": "perf checks", "why": "dflash-ladder not started"})
    elif not r.skip_checks:
        r.step("dflash checks", dflash_checks, need=60)
        r.step("dflash sampled", lambda: _sampled_times(r, "dflash-ladder",
                                                        port["dflash-ladder"]), need=30)
        r.step("sampling laws", lambda: _laws(r, port), need=60)

    if r.profile:
        r.step("profile", lambda: _profiles(r, port), need=60)

    # dummy weights first: there DFLASH and DDTREE 15/8 verify the same width (16)
    for group in (("nospec-dummy", "dflash-dummy", "ddtree15-dummy", "ddtree15-dummy-eager",
                   "ddtree31-dummy"),
                  ("nospec-ladder", "dflash-ladder", "ddtree15-ladder", "ddtree15-ladder-eager",
                   "ddtree31-ladder")):
        live = [(s.name, s.port) for s in servers if s.name in group and r.healthy(s.name)]
        if live and r.left() > 60:
            r.result["perf"].update(p.measure(live, rounds=r.rounds, tokens=256))
            r.save()
        else:
            r.result["not_run"].append({"step": f"perf {group}", "why": "no time or no server"})

    def ddtree_lossless() -> None:  # the measured payload's answers, after its timings
        mixed = checks.prompt_set(lad, 40, seed=1)
        for s in servers:
            if s.algorithm == "ddtree" and not s.dummy and r.healthy(s.name):
                res = checks.lossless(s.port, lad, mixed, concurrency=40, algorithm="DDTREE",
                                      budget=s.budget or 15, topk=s.topk or 8)
                res.pop("outputs")
                r.result["checks"][f"lossless/{s.name}"] = res
        r.save(logs=False)

    r.step("ddtree lossless", ddtree_lossless, need=30)


PROFILED = (("dflash-dummy", True), ("ddtree15-dummy", True), ("ddtree15-dummy-eager", False),
            ("dflash-ladder", False), ("ddtree15-ladder", False), ("nospec-dummy", False))


def _profiles(r: Rehearsal, port: dict[str, int]) -> None:
    """SGLang's torch profiler over 24 forward steps of one greedy request per server, one
    server at a time (the others idle, asleep), without Python stacks (true timings) and, for
    some, with them (which functions the host time is in). Summaries go into the JSON; the
    traces without stacks into OUT/traces.tar while it stays under 12 MB."""
    from rehearsal import profile

    out = r.result.setdefault("profiles", {})
    keep: list[Path] = []
    for name, stacks in PROFILED:
        for with_stack in (False, True) if stacks else (False,):
            key = f"{name}/{'stack' if with_stack else 'plain'}"
            if not r.healthy(name) or r.left() < 90:
                r.result["not_run"].append({"step": f"profile {key}", "why": "no time or server"})
                continue
            folder = WORK / "profiles" / key.replace("/", "-")
            try:
                out[key] = profile.capture(port[name], folder, steps=24, tokens=160,
                                           with_stack=with_stack,
                                           timeout=max(30.0, min(120.0, r.left() - 30)))
            except Exception as exc:  # one server's failure is its own
                out[key] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            if not with_stack:
                keep.append(folder / out[key]["trace_file"])
            r.save(logs=False)
    total = 0
    with tarfile.open(r.out / "traces.tar", "w") as tar:
        for path in keep:
            total += path.stat().st_size
            if total > 12_000_000:
                break
            tar.add(path, arcname=f"{path.parent.name}.trace.json.gz")


def _sampled_times(r: Rehearsal, name: str, port: int) -> None:
    """Three streamed sampled requests after the probe: how long each took, and its gaps."""
    from rehearsal import client

    if not r.healthy(name):
        raise RuntimeError(f"{name} is not healthy: nothing to time")
    out = []
    for i in range(3):
        ans = client.generate(port, [11, 12, 100], 16,
                              sampling={"temperature": 0.7, "top_p": 0.9, "top_k": 20},
                              stream=True, timeout=max(10.0, min(150.0, r.left() - 60)))
        out.append({"try": i, "seconds": round(ans.seconds, 2), "tokens": len(ans.output_ids),
                    "error": ans.error, "max_gap": round(max(ans.chunk_gaps, default=0.0), 2)})
    r.result["checks"][f"sampled-times/{name}"] = {"tries": out}


# The laws (name, top_k, top_p): temperature only (as run 2), top-p alone (SGLang keeps a token
# while the mass before it is <= top-p: top-1 share 0.625 on the ladder), and top-k with top-p
# (SGLang's top-p sums the whole distribution: 0.89; DFLASH 0.5.11 renormalises the top-k
# survivors first, which leaves the top-1 alone).
LAWS = (("temperature", -1, 1.0), ("top-p 0.8", -1, 0.8), ("top-k 20 top-p 0.8", 20, 0.8))


def _laws(r: Rehearsal, port: dict[str, int]) -> None:

    from rehearsal import checks

    logits = checks.transition_logits(WORK / "models" / "ladder" / "target")
    t = checks.half_temperature(logits)
    for law, top_k, top_p in LAWS:
        for name in ("nospec-ladder", "ddtree15-ladder", "dflash-ladder"):
            if r.healthy(name) and r.left() > 40:
                r.result["checks"][f"sampling/{law}/{name}"] = checks.sampling_law(
                    port[name], logits, temperature=t, count=64, length=48, seed=7,
                    top_k=top_k, top_p=top_p)
                r.save(logs=False)


def bench(r: Rehearsal, order: tuple[str, ...] = ("ladder", "dummy"), *,
          resume: bool = False) -> None:
    """issue 15's small grid: the tool's `bench` in plain-process mode against a designed-weights
    and a dummy-weights deployment, one after the other (one apply lock per host), in ``order``.

    ``resume``: a results file committed under benchmarks/results/bench/h200-<kind>/ seeds the
    sweep's results file, so the tool's resume measures only the cells that file lacks."""
    import signal

    from rehearsal.servers import Server, hosts_file, results_of

    m = WORK / "models"
    grid = REPO / "benchmarks" / "grids" / "h200-small.yaml"
    folder = r.logs / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    env = work_env()
    # DFLASH is left out on dummy weights: its sampled verify never returned there (run 5), so
    # the probe of that configuration would hang the GPU for the rest of the sweep.
    same_grid = ["--concurrency", "1,8", "--sampling", "greedy,sampled", "--workloads",
                 "code,json,agentic", "--requests", "8", "--max-new-tokens", "64",
                 "--time-limit", "30", "--warmup-requests", "1", "--prompts", "ids"]
    runs = (("bench-ladder", m / "ladder", False, "synthetic: designed weights (ladder)",
             ["--grid", str(grid)]),
            ("bench-dummy", m / "dummy", True, "synthetic: dummy weights",
             ["--configs", "none,ddtree:15/8,ddtree:31/8", *same_grid]))
    out = r.result.setdefault("bench", {})
    by_kind = {run[0].removeprefix("bench-"): (i, run) for i, run in enumerate(runs)}
    for kind in order:
        if kind not in by_kind:
            r.result["errors"].append({"step": "bench", "trace": f"unknown deployment {kind!r}"})
            continue
        i, (name, models, dummy, label, grid_args) = by_kind[kind]
        seed = REPO / "benchmarks" / "results" / "bench" / f"h200-{kind}" / f"{name}.json"
        if r.left() < (120 if resume and seed.is_file() else 200):
            r.result["not_run"].append({"step": f"bench {name}", "why": f"{r.left():.0f} s left"})
            continue
        server = Server(name, str(models), "ddtree", 15, 8, dummy=dummy, port=31100 + i,
                        extra=("--cuda-graph-max-bs", "8", "--max-running-requests", "16"))
        hosts = hosts_file(server, str(VENV), r.logs)
        results = folder / f"{name}.json"
        if resume and seed.is_file():
            shutil.copyfile(seed, results)
        argv = [str(r.cli), "--hosts", str(hosts), "bench", "localhost", name, *grid_args,
                "--mode", "plain", "--force", "--yes", "--results", str(results),
                "--deadline", "240", "--warmup", "200", "--label", label, "--json"]
        t0 = time.monotonic()
        with open(r.logs / f"tool-{name}.out", "w") as log:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                    env=env, cwd=REPO)
            try:
                stdout, _ = proc.communicate(timeout=max(30.0, r.left() - 45))
            except subprocess.TimeoutExpired:  # Ctrl-C: bench stops its server, keeps results
                proc.send_signal(signal.SIGINT)
                try:
                    stdout, _ = proc.communicate(timeout=40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    stdout, _ = proc.communicate()
            log.write("\n--- stdout ---\n" + (stdout or ""))
        entry: dict[str, Any] = {"exit": proc.returncode,
                                 "seconds": round(time.monotonic() - t0, 1), "argv": argv}
        entry["summary"] = results_of(stdout or "") if stdout and stdout.strip() else None
        if results.is_file():
            try:
                entry["results"] = json.loads(results.read_text())
            except json.JSONDecodeError as exc:
                entry["results_error"] = str(exc)
        out[name] = entry
        r.save()


def dflash_sampled(r: Rehearsal, server: Any) -> None:
    """How long DFLASH's first sampled requests take (the probe saw a stall after token 1)."""
    from rehearsal import client

    def go() -> None:
        if not r.healthy(server.name):
            raise RuntimeError(f"{server.name} is not healthy: nothing to time")
        out = []
        for i in range(3):
            ans = client.generate(server.port, [11, 12, 100], 8,
                                  sampling={"temperature": 0.7, "top_p": 0.9, "top_k": 20},
                                  stream=True, timeout=max(10.0, r.left() - 20))
            out.append({"try": i, "seconds": round(ans.seconds, 2), "tokens": len(ans.output_ids),
                        "error": ans.error, "gaps": [round(g, 2) for g in ans.chunk_gaps]})
            r.result["checks"]["dflash-sampled"] = {"tries": out}
            r.save()

    r.step("dflash sampled", go, need=20)


def graph_use(logs: Path) -> dict[str, Any]:
    """Per DDTREE server, from its log: whether its round graphs were on, the batch sizes whose
    plan and walk graphs it captured, and the warning if they went off; the tree kernel's
    start-up check and (the plugin form) how the target's verify runs."""
    out: dict[str, Any] = {}
    for log in sorted(logs.glob("*.log")):
        text = log.read_text(errors="replace")
        if "DDTREE ready:" not in text and "DDTREE ready (" not in text:
            continue
        entry: dict[str, Any] = {"on": "round_graphs=on" in text, "plan": [], "walk": [],
                                 "off": None, "tree_attention": None, "target_verify": None}
        for line in text.splitlines():
            if "DDTREE tree verify attention" in line and entry["tree_attention"] is None:
                entry["tree_attention"] = line.split("DDTREE tree verify attention", 1)[1] \
                    .strip()[:200]
            elif "DDTREE target verify:" in line and entry["target_verify"] is None:
                entry["target_verify"] = line.split("DDTREE target verify:", 1)[1].strip()[:300]
            elif "DDTREE round graph captured:" in line:
                what, _, bs = line.split("captured:", 1)[1].strip().partition(" bs=")
                if what in ("plan", "walk") and bs.strip().isdigit():
                    entry[what].append(int(bs))
            elif "DDTREE round graphs off" in line and entry["off"] is None:
                entry["off"] = line.strip()[-300:]
        entry["plan"], entry["walk"] = sorted(entry["plan"]), sorted(entry["walk"])
        out[log.stem] = entry
    return out

