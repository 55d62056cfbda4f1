"""bench and SIGINT: a real signal stops the sweep while a start waits, and a process that came
with SIGINT ignored says that Ctrl-C cannot stop it (SIGTERM can).

CI started the suite as a background job of a shell without job control, which hands SIGINT
down ignored; bench's Ctrl-C tests then saw a sweep run on (tests/foreground.py). The sweep runs
in this process here, with a server control that waits in its start as the lab's gated stand-in
does; the signal is a real one, sent to this process from another thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from bench_specs import base_spec, specs_for
from foreground import sigint_default

from ddtree_deploy.bench import grid as gridmod
from ddtree_deploy.bench import sweep as sweepmod
from ddtree_deploy.bench import workloads
from ddtree_deploy.bench.results import Results
from ddtree_deploy.health.check import Verdict
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.transport.local import LocalTransport

HOLD_S = 60.0  # a start waits at most this long for the signal: a lost one fails, never hangs


@dataclass
class HeldControl:
    """Starts wait (as the lab stand-in's gate holds them) until a signal cuts them short."""

    mode: str = "plain"
    entered: threading.Event = field(default_factory=threading.Event)
    starts: list[str] = field(default_factory=list)
    restored: int = 0

    def prepare(self) -> None:
        pass

    def start(self, spec: ServiceSpec, key: str, deadline_s: float, warmup_s: float
              ) -> tuple[Verdict, dict[str, Any]]:
        self.starts.append(key)
        self.entered.set()
        end = time.monotonic() + HOLD_S
        while time.monotonic() < end:
            time.sleep(0.05)
        return Verdict("deadline", f"no verdict within {deadline_s:g} s"), {}

    def restore(self) -> str:
        self.restored += 1
        return "put back"


def _plan(tmp_path: Path, configs: str) -> tuple[sweepmod.Plan, Results]:
    grid = gridmod.from_flags(configs, "1", "greedy", "code", workloads.names(), requests=1,
                              max_new_tokens=4, warmup_requests=0, prompts="ids")
    base = base_spec(name="sglang-bench", host="localhost", venv=str(tmp_path / "venv"),
                     gpus=(0,), port=30999, model_path=str(tmp_path / "target"))
    specs = specs_for(base, grid, str(tmp_path / "draft"))
    results = Results.open(tmp_path / "results.json", host="localhost", service="sglang-bench")
    return sweepmod.make_plan(grid, specs, results, ids=True, vocab=1024), results


@pytest.fixture()
def sigint_restored() -> Iterator[None]:
    """Whatever a test sets SIGINT to, this process gets back what it had."""
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_sigint_stops_the_sweep_while_a_start_waits(tmp_path: Path,
                                                    sigint_restored: None) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal
    plan, results = _plan(tmp_path, "dflash,ddtree:15/8")
    control = HeldControl()
    said: list[str] = []

    def ctrl_c() -> None:
        if control.entered.wait(HOLD_S):
            os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=ctrl_c, daemon=True)
    sender.start()
    with pytest.raises(sweepmod.SweepInterrupted) as stopped:
        sweepmod.run_sweep(LocalTransport(host="localhost"), control, plan, results,
                           deadline_s=HOLD_S, warmup_s=HOLD_S,
                           hooks=sweepmod.Hooks(say=said.append))
    sender.join()
    assert control.starts == ["dflash"]  # stopped in the first start: the next never began
    assert control.restored == 1
    summary = stopped.value.summary
    assert summary["interrupted"] is True and summary["restored"] == "put back"
    assert summary["unhealthy"] == [] and summary["measured"] == 0
    assert not any(m.startswith("note:") for m in said)  # Ctrl-C works: nothing to say


def test_a_sweep_that_came_with_sigint_ignored_says_ctrl_c_cannot_stop_it(
        tmp_path: Path, sigint_restored: None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    plan, results = _plan(tmp_path, "dflash")
    plan.todo = []  # nothing to start: only what the sweep says before it begins
    said: list[str] = []
    sweepmod.run_sweep(LocalTransport(host="localhost"), HeldControl(), plan, results,
                       deadline_s=1, warmup_s=1, hooks=sweepmod.Hooks(say=said.append))
    notes = [m for m in said if m.startswith("note:")]
    assert notes == [f"note: this process was started with SIGINT ignored (e.g. in the "
                     f"background by a script), so Ctrl-C does not stop the sweep; SIGTERM "
                     f"does: kill {os.getpid()}"]


@pytest.mark.integration  # starts sh and python
def test_a_background_job_of_a_script_inherits_sigint_ignored_and_the_helper_undoes_it() -> None:
    """Why tests/foreground.py exists: `cmd &` in a shell without job control ignores SIGINT in
    cmd, and Python keeps it so (no KeyboardInterrupt handler)."""
    show = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"]
    script = '"$@" & wait'
    plain = subprocess.run(["sh", "-c", script, "sh", *show], capture_output=True, text=True,
                           check=True, timeout=60)
    fixed = subprocess.run(["sh", "-c", script, "sh", *sigint_default(show)],
                           capture_output=True, text=True, check=True, timeout=60)
    assert plain.stdout.strip() == str(signal.SIG_IGN)
    assert fixed.stdout.strip() == str(signal.default_int_handler)
