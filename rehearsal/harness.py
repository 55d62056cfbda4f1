"""The GPU rehearsal's session (``rehearsal.run``): its scratch folder, budget, result document
and log archive, each step timed and recorded, the tool's own commands, the carry set's install,
the models, the payload deploy and the servers' start (each waited for until healthy) and stop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from rehearsal import perf8b

REPO = Path(__file__).resolve().parents[1]
VENV = Path("/opt/torch/.venv")
WORK = Path("/tmp/rehearsal")  # noqa: S108 -- the GPU host's scratch folder, made anew


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
