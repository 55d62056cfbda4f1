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
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from rehearsal import perf8b

REPO = Path(__file__).resolve().parents[1]
VENV = Path("/opt/torch/.venv")
WORK = Path("/tmp/rehearsal")  # noqa: S108 -- the GPU host's scratch folder, made anew


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


def work_env() -> dict[str, str]:
    """The environment of what the rehearsal starts on the GPU host: HOME in the scratch folder
    (tvm-ffi, flashinfer, triton and sglang keep their JIT caches under it), unbuffered output."""
    (WORK / "home").mkdir(parents=True, exist_ok=True)
    return {**os.environ, "HOME": str(WORK / "home"), "PYTHONUNBUFFERED": "1"}


class Rehearsal:
    def __init__(self, carry: Path, out: Path, budget: float, phase: str) -> None:
        self.carry, self.out, self.phase = carry.resolve(), out, phase
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget
        self.logs = WORK / "logs"
        self.result: dict[str, Any] = {"format": 1, "phase": phase, "steps": {}, "servers": {},
                                       "checks": {}, "perf": {}, "not_run": [], "errors": []}
        self.cli = self.carry / "bin" / "ddtree-deploy"
        self.running: dict[str, Any] = {}
        self._save_lock = threading.Lock()
        self.skip_checks = False
        self.profile = False
        self.rounds = 3
        self.sglang = "0.5.11"  # 0.5.17+: the plugin form

    # --- bookkeeping ----------------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self, *, logs: bool = True) -> None:
        with self._save_lock:  # steps run in threads; one writer at a time
            self.result["elapsed_s"] = round(time.monotonic() - self.t0, 1)
            tmp = self.out / "rehearsal.json.tmp"
            for _ in range(20):  # other threads add results while the encoder walks the dicts
                try:
                    text = json.dumps(self.result, indent=1, default=str)
                    break
                except RuntimeError:
                    time.sleep(0.05)
            else:
                text = json.dumps({"format": 1, "phase": self.phase, "errors": [
                    {"step": "save", "trace": "results changed while being written"}]})
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(self.out / "rehearsal.json")
            if logs:
                with tarfile.open(self.out / "logs.tar.gz.tmp", "w:gz") as tar:
                    if self.logs.is_dir():
                        tar.add(self.logs, arcname="logs")
                (self.out / "logs.tar.gz.tmp").replace(self.out / "logs.tar.gz")

    def step(self, name: str, fn: Any, *, need: float = 0.0) -> Any:
        if self.left() < need:
            self.result["not_run"].append({"step": name, "why": f"{self.left():.0f} s left"})
            self.save()
            return None
        t = time.monotonic()
        try:
            value = fn()
            self.result["steps"][name] = {"ok": True, "seconds": round(time.monotonic() - t, 1)}
            return value
        except Exception as exc:  # recorded, the rest goes on
            self.result["steps"][name] = {"ok": False, "seconds": round(time.monotonic() - t, 1),
                                          "error": f"{type(exc).__name__}: {exc}"}
            self.result["errors"].append({"step": name, "trace": traceback.format_exc()[-3000:]})
            return None
        finally:
            self.save()

    def sh(self, name: str, argv: list[str], timeout: float = 300.0,
           env: dict[str, str] | None = None) -> dict[str, Any]:
        t = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              env=env, cwd=REPO)
        (self.logs / f"{name}.out").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
        return {"exit": done.returncode, "seconds": round(time.monotonic() - t, 1),
                "stdout_tail": done.stdout[-1500:], "stderr_tail": done.stderr[-1500:]}

    # --- phases -------------------------------------------------------------------------------
    def install(self) -> None:
        r = self.sh("carry-install", [sys.executable, "-m", "rehearsal.carry", "install",
                                      str(self.carry), "--target", str(VENV)], timeout=400)
        self.result["steps"]["carry_install_detail"] = r
        if r["exit"] != 0:
            raise RuntimeError(f"carry install exited {r['exit']}: {r['stderr_tail']}")
        site = self.carry / "tool-site"
        if str(site) not in sys.path:  # first: the carried wheel, not the working tree's copy
            sys.path.insert(0, str(site))

    def models(self) -> None:
        from rehearsal import models

        for design in ("ladder", "alarm"):
            r = self.sh(f"models-{design}", [sys.executable, "-m", "rehearsal.models",
                                             str(WORK / "models" / design), "--design", design])
            if r["exit"] != 0:
                raise RuntimeError(f"models {design}: {r['stderr_tail']}")
            self.result["steps"][f"models_{design}"] = r["stdout_tail"]
        base = models.get_design("ladder")
        dummy = replace(base, hidden_size=1024, vocab_size=32000, block_size=16)
        for part, cfg in (("target", models.target_config(dummy)),
                          ("draft", models.draft_config(dummy))):
            folder = WORK / "models" / "dummy" / part
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text(json.dumps(cfg, indent=1))
        perf8b.write_models(WORK / "models" / "q8b")

    def tool(self, hosts: Path, calls: list[tuple[str, list[str]]]) -> None:
        out = self.result.setdefault("tool", {})
        # No network here: a pip download (the plugin form's uv, fetched where the host has
        # none) fails at once instead of retrying, and the tool falls back to the venv's pip.
        env = {**os.environ, "PIP_NO_INDEX": "1"}
        for name, args in calls:
            out[name] = self.sh(f"tool-{name}", [str(self.cli), "--hosts", str(hosts), *args],
                                env=env)
            self.save(logs=False)

    def prewarm(self) -> subprocess.Popen[str] | None:
        """Start rehearsal.prewarm (DFLASH's sampled-verify kernels, timed) in the servers'
        environment; it runs while the payload is deployed."""
        from rehearsal.servers import SERVER_ENV

        env = dict(os.environ)
        env.update({"HOME": str(WORK / "home"), **SERVER_ENV})
        (WORK / "home").mkdir(parents=True, exist_ok=True)
        try:
            with open(self.logs / "prewarm.out", "w") as log:  # the child keeps its own copy
                return subprocess.Popen([sys.executable, "-m", "rehearsal.prewarm",
                                         str(self.logs / "prewarm.json")], stdout=log,
                                        stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
        except OSError as exc:
            self.result["errors"].append({"step": "prewarm", "trace": str(exc)})
            return None

    def prewarm_done(self, proc: subprocess.Popen[str] | None) -> None:
        if proc is None:
            return
        try:
            proc.wait(timeout=max(10.0, min(200.0, self.left() - 300)))
        except subprocess.TimeoutExpired:
            self.result["checks"]["prewarm"] = {"still_running_after_s": round(
                time.monotonic() - self.t0, 1)}
            return  # left running: it only fills caches; stop_all does not need it
        path = self.logs / "prewarm.json"
        self.result["checks"]["prewarm"] = (json.loads(path.read_text()) if path.is_file()
                                            else {"exit": proc.returncode})

    def deploy_payload(self, hosts: Path) -> None:
        # the plugin form: the venv's own pip (the host has no uv and no network to fetch one)
        pip = ["--installer", "pip"] if self.sglang != "0.5.11" else []
        self.tool(hosts, [("payload_deploy", ["payload", "deploy", "localhost", "--venv",
                                              str(VENV), *pip])])
        if self.result["tool"]["payload_deploy"]["exit"] != 0:
            raise RuntimeError("the payload is not deployed: servers cannot run DDTREE")

    def facts_commands(self, hosts: Path) -> None:
        v = str(VENV)
        self.tool(hosts, [
            ("inventory", ["inventory", "localhost", "--refresh", "--json"]),
            ("doctor", ["doctor", "localhost", "--venv", v, "--json"]),
            ("payload_verify", ["payload", "verify", "localhost", "--venv", v, "--json"]),
            ("payload_status", ["payload", "status", "localhost", "--json"]),
        ])

    def graphs_check(self) -> None:
        """The deployed payload's round graphs against its eager round (rehearsal/graphs_check)."""
        env = work_env()
        done = subprocess.run([str(VENV / "bin" / "python"), "-m", "rehearsal.graphs_check"],
                              capture_output=True, text=True, cwd=REPO, env=env, check=False,
                              timeout=max(30.0, min(240.0, self.left() - 60)))
        (self.logs / "graphs-check.err").write_text(done.stderr[-200_000:])
        try:
            out = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            out = {"ok": False, "error": f"exit {done.returncode}, no JSON",
                   "stderr": done.stderr[-1500:]}
        self.result["checks"]["round-graphs"] = out
        self.save(logs=False)

    def rollback_commands(self, hosts: Path) -> None:
        v = str(VENV)
        self.tool(hosts, [
            ("payload_rollback", ["payload", "rollback", "localhost", "--venv", v]),
            ("payload_verify_after_rollback", ["payload", "verify", "localhost", "--venv", v,
                                               "--json"]),
            ("payload_status_after_rollback", ["payload", "status", "localhost", "--json"]),
        ])

    def start_servers(self, servers: list[Any], *, warm: int, meanwhile: Any = None) -> None:
        """Start ``servers``: the first ``warm`` together (they fill the JIT caches, while
        ``meanwhile`` runs), then the rest together; each is probed by the tool."""
        from rehearsal import servers as srv

        env = work_env()
        hosts = {s.name: srv.hosts_file(s, s.venv or str(VENV), self.logs) for s in servers}
        units = {}
        for s in servers:
            units[s.name] = srv.render(self.cli, hosts[s.name], s.name)
            (self.logs / f"{s.name}.service").write_text(units[s.name]["unit"])

        def launch(s: Any) -> None:
            run = srv.start(s, units[s.name], self.logs, env)
            self.running[s.name] = run
            if not s.tool_probe:
                self.result["servers"][s.name] = {
                    "port": s.port, "argv": run.argv, "probe_exit": None,
                    "healthy_by": _greedy_ready(s.port, run.pid,
                                                max(30.0, min(300.0, self.left() - 100))),
                    "ready_s": round(time.monotonic() - run.started, 1),
                    "why_no_tool_probe": "its sampled generation hangs this server (run 5)"}
                self.save(logs=False)
                return
            code, verdict = srv.probe(self.cli, hosts[s.name], run,
                                      deadline=max(30.0, min(300.0, self.left() - 100)))
            run.healthy_s = round(time.monotonic() - run.started, 1)
            self.result["servers"][s.name] = {
                "port": s.port, "argv": run.argv, "probe_exit": code,
                "probe": {k: verdict.get(k) for k in ("status", "reason", "warmup_s",
                                                      "elapsed_s", "tok_per_s", "diagnosis")},
                "ready_s": run.healthy_s}
            self.save(logs=False)

        groups = [g for g in (servers[:warm], servers[warm:]) if g]
        for i, group in enumerate(groups or [[]]):
            with ThreadPoolExecutor(max_workers=len(group) + 1) as pool:
                jobs = [pool.submit(launch, s) for s in group]
                if meanwhile is not None and i == 0:  # once, beside the first group's start
                    jobs.append(pool.submit(meanwhile))
                for job in jobs:
                    job.result()

    def healthy(self, name: str) -> bool:
        entry = self.result["servers"].get(name, {})
        return entry.get("probe_exit") == 0 or entry.get("healthy_by") == "greedy"

    def stop_all(self) -> None:
        """Stop every server at once (one at a time took up to 20 s each: run 5 ran past its
        call's limit while stopping)."""
        from rehearsal import servers as srv

        def stop(item: tuple[str, Any]) -> None:
            try:
                srv.stop(item[1])
            except Exception as exc:
                self.result["errors"].append({"step": f"stop {item[0]}", "trace": str(exc)})

        items = list(self.running.items())
        if items:
            with ThreadPoolExecutor(max_workers=len(items)) as pool:
                list(pool.map(stop, items))
        self.running.clear()


def _greedy_ready(port: int, pid: int, deadline: float) -> str:
    """Wait for /health 200 and one greedy answer (no sampled request): 'greedy', or why not."""
    import urllib.request

    from rehearsal import client

    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if not os.path.exists(f"/proc/{pid}"):
            return "exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                up = resp.status == 200
        except Exception:  # refused, 503, timeout: not up yet
            up = False
        if up:
            ans = client.generate(port, [11, 12, 100], 16,
                                  timeout=max(5.0, end - time.monotonic()))
            if ans.error is None and len(ans.output_ids) == 16:
                return "greedy"
        time.sleep(1.0)
    return "deadline"


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
    if phase in ("correctness", "request-params"):  # lossless checks of the plugin's opt-ins
        from rehearsal.servers import opted_in

        specs = opted_in(specs, sglang)
    # The tool renders --speculative-num-draft-tokens from each drafter's config.json (8 for the
    # designs, 16 for the dummy drafter; run 3's units show both).
    return [replace(s, port=31000 + i) for i, s in enumerate(specs)]


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
