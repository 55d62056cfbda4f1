"""The bench sweep: for each configuration bring the service up, warm up, measure every cell.

Under apply's per-host lock throughout. The service is restarted once per configuration that
still has cells to measure (resume: measured cells are in the results file and never run
again); at the end -- also after a failure, Ctrl-C or SIGTERM -- what was installed before is
put back (server.py). A configuration whose server does not come up healthy is recorded with
the probe's verdict and the sweep goes on with the next one.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ddtree_deploy.bench import workloads
from ddtree_deploy.bench.grid import SAMPLED_PARAMS, BenchConfig, Grid
from ddtree_deploy.bench.metrics import cell_metrics, first_errors
from ddtree_deploy.bench.results import CellKey, Results
from ddtree_deploy.bench.server import ServerControl
from ddtree_deploy.errors import DeployError
from ddtree_deploy.remote.bundle import text
from ddtree_deploy.remote.runner import run_json
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport

LOADGEN = "loadgen.py"  # in remote/
REQUEST_TIMEOUT_S = 300.0


@dataclass
class Cell:
    config: BenchConfig
    workload: str
    concurrency: int
    sampling: str
    repeat: int

    @property
    def key(self) -> CellKey:
        return (self.config.key, self.workload, self.concurrency, self.sampling, self.repeat)

    @property
    def label(self) -> str:
        return (f"{self.config.label} {self.workload} c={self.concurrency} {self.sampling}"
                + (f" #{self.repeat + 1}" if self.repeat else ""))


@dataclass
class Plan:
    """Everything resolved before the lock is taken: specs, prompts, what is left to do."""

    grid: Grid
    specs: dict[str, ServiceSpec]
    ids: bool  # token-id prompts
    vocab: int
    todo: list[Cell] = field(default_factory=list)
    skipped: int = 0

    def configs_to_run(self) -> list[BenchConfig]:
        keys = {c.config.key for c in self.todo}
        return [c for c in self.grid.configs if c.key in keys]


def cells(grid: Grid) -> list[Cell]:
    return [Cell(c, w, n, s, r) for c in grid.configs for r in range(grid.repeats)
            for w in grid.workloads for n in grid.concurrency for s in grid.sampling]


def make_plan(grid: Grid, specs: dict[str, ServiceSpec], results: Results, *, ids: bool,
              vocab: int) -> Plan:
    done = results.done()
    every = cells(grid)
    todo = [c for c in every if c.key not in done]
    return Plan(grid, specs, ids, vocab, todo, len(every) - len(todo))


def loadgen_command(plan: dict[str, Any], python: str = "python3") -> Command:
    source = text(LOADGEN)
    return Command(argv=(python, "-I", "-S", "-"),
                   stdin=f"PLAN = {json.dumps(json.dumps(plan))}\n{source}".encode())


def run_load(t: ExecTransport, spec: ServiceSpec, sessions: list[dict[str, Any]], *,
             ids: bool, concurrency: int, sampling: str, max_new_tokens: int,
             time_limit_s: float) -> dict[str, Any]:
    """One cell's load, generated on the host against the service's loopback address."""
    plan = {"addr": "127.0.0.1", "port": spec.port, "ids": ids, "sessions": sessions,
            "concurrency": concurrency, "max_new_tokens": max_new_tokens,
            "params": SAMPLED_PARAMS if sampling == "sampled" else {"temperature": 0.0},
            "time_limit_s": time_limit_s, "request_timeout_s": REQUEST_TIMEOUT_S}
    raw = run_json(t, loadgen_command(plan), timeout=time_limit_s + REQUEST_TIMEOUT_S + 60,
                   what="the load generator")
    if "error" in raw:
        raise DeployError(f"{t.host}: {raw['error']}")
    return raw


@contextmanager
def interrupts_as_keyboard() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt while the sweep runs (so restore runs in finally)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def sigint_note() -> str | None:
    """What to tell the user when Ctrl-C cannot stop the sweep: this process came with SIGINT
    ignored (a shell without job control starts its background commands so, and a SIGINT the
    caller ignored stays ignored); SIGTERM still stops it, putting the service back."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        return None
    return (f"note: this process was started with SIGINT ignored (e.g. in the background by a "
            f"script), so Ctrl-C does not stop the sweep; SIGTERM does: kill {os.getpid()}")


@contextmanager
def shielded() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while the unit is put back (a second Ctrl-C cannot cut it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the sweep; `summary` is complete (the service put back)."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__()
        self.summary = summary


@dataclass
class Hooks:
    """What the CLI shows while the sweep runs (progress, messages)."""

    say: Callable[[str], None] = lambda _m: None
    cell_done: Callable[[Cell, dict[str, Any]], None] = lambda _c, _m: None
    check_lock: Callable[[], None] = lambda: None


def run_sweep(t: ExecTransport, control: ServerControl, plan: Plan, results: Results, *,
              deadline_s: float, warmup_s: float, hooks: Hooks) -> dict[str, Any]:
    """Run what is left of the plan; always restores. Returns a summary (raises
    SweepInterrupted, a KeyboardInterrupt, with it after Ctrl-C or SIGTERM)."""
    grid = plan.grid
    summary: dict[str, Any] = {"measured": 0, "skipped": plan.skipped, "unhealthy": [],
                               "interrupted": False, "restored": None}
    note = sigint_note()
    if note is not None:
        hooks.say(note)
    control.prepare()
    try:
        with interrupts_as_keyboard():
            for config in plan.configs_to_run():
                hooks.check_lock()
                spec = plan.specs[config.key]
                hooks.say(f"{config.label}: restarting {spec.name} "
                          f"({' '.join(spec.server_args()[6:]) or 'no speculation'})")
                t0 = time.monotonic()
                verdict, extra = control.start(spec, config.key, deadline_s, warmup_s)
                info = {"config": config.to_json(), "flags": spec.server_args(),
                        "mode": control.mode, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "probe": {"status": verdict.status, "reason": verdict.reason,
                                  "elapsed_s": round(verdict.elapsed_s, 3),
                                  "warmup_s": round(verdict.warmup_s, 3),
                                  "diagnosis": [m.to_json() for m in verdict.diagnosis]},
                        **extra}
                if verdict.status != "healthy":
                    results.set_config(config.key, {**info, "error": verdict.reason})
                    results.save()
                    summary["unhealthy"].append({
                        "config": config.key, "reason": verdict.reason,
                        "diagnosis": [m.id for m in verdict.diagnosis]})
                    hooks.say(f"{config.label}: {verdict.status}: {verdict.reason}; skipped")
                    continue
                warm = _warm_up(t, spec, plan)
                info["warmup"] = {"seconds": round(time.monotonic() - t0, 3), **warm}
                results.set_config(config.key, info)
                results.save()
                for cell in [c for c in plan.todo if c.config.key == config.key]:
                    hooks.check_lock()
                    sessions = workloads.sessions(cell.workload, grid.requests, ids=plan.ids,
                                                  vocab=plan.vocab)
                    raw = run_load(t, spec, sessions, ids=plan.ids,
                                   concurrency=cell.concurrency, sampling=cell.sampling,
                                   max_new_tokens=grid.max_new_tokens,
                                   time_limit_s=grid.time_limit_s)
                    metrics = cell_metrics(raw)
                    metrics["stopped_by_time"] = bool(raw.get("stopped_by_time"))
                    results.add_cell(cell.key, metrics, first_errors(raw))
                    results.save()
                    summary["measured"] += 1
                    hooks.cell_done(cell, metrics)
    except KeyboardInterrupt:
        summary["interrupted"] = True
        raise SweepInterrupted(summary) from None  # `restored` is filled in before it leaves
    finally:
        with shielded():
            hooks.say("putting back the service as it was ...")
            summary["restored"] = control.restore()
            results.save()
            hooks.say(summary["restored"])
    return summary


def _warm_up(t: ExecTransport, spec: ServiceSpec, plan: Plan) -> dict[str, Any]:
    """A few unrecorded requests per sampling mode (JIT compiles of a first start land here)."""
    grid = plan.grid
    out: dict[str, Any] = {}
    if grid.warmup_requests <= 0:
        return out
    for sampling in grid.sampling:
        sessions = workloads.sessions(grid.workloads[0], grid.warmup_requests, ids=plan.ids,
                                      vocab=plan.vocab)
        for s in sessions:
            s["tools"] = []
        raw = run_load(t, spec, sessions, ids=plan.ids, concurrency=1, sampling=sampling,
                       max_new_tokens=min(32, grid.max_new_tokens),
                       time_limit_s=REQUEST_TIMEOUT_S)
        m = cell_metrics(raw)
        out[sampling] = {"requests": m["requests"], "failed": m["failed"],
                         "wall_s": m["wall_s"]}
    return out
