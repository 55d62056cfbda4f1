"""Run a small bench sweep in plain-process mode on this machine (for tests/test_bench_sweep.py).

`python tests/bench_sweep_runner.py ROOT PORT CONFIGS` with ROOT holding venv/ (whose bin/python
runs tests/bench_fake_server.py), target/ and draft/ (config.json each). Results go to
ROOT/res/results.json; one JSON summary line is printed; exit 130 on Ctrl-C or SIGTERM. With
BENCH_RUNNER_HOLD=1 the sweep waits up to 60 s after its first measured cell (the test signals).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bench_specs import base_spec, specs_for

from ddtree_deploy.bench import grid as gridmod
from ddtree_deploy.bench import workloads
from ddtree_deploy.bench.results import Results
from ddtree_deploy.bench.server import PlainControl
from ddtree_deploy.bench.sweep import Hooks, make_plan, run_sweep
from ddtree_deploy.transport.local import LocalTransport


def main(root: Path, port: int, configs: str) -> int:
    grid = gridmod.from_flags(configs, "1,2", "greedy,sampled", "code,agentic",
                              workloads.names(), requests=2, max_new_tokens=12,
                              warmup_requests=1, prompts="ids")
    base = base_spec(name="sglang-bench", host="localhost", venv=str(root / "venv"), gpus=(0,),
                     port=port, model_path=str(root / "target"),
                     extra_args=("--skip-tokenizer-init",),
                     # a plain process gets the unit's environment only: the fault goes in it
                     environment={k: v for k, v in os.environ.items() if k == "BENCH_FAKE_FAIL"})
    specs = specs_for(base, grid, str(root / "draft"))
    results = Results.open(root / "res" / "results.json", host="localhost",
                           service="sglang-bench")
    plan = make_plan(grid, specs, results, ids=True, vocab=1024)
    t = LocalTransport(host="localhost")
    control = PlainControl(t, root / "res" / "logs")

    hold = [True] if os.environ.get("BENCH_RUNNER_HOLD") == "1" else []  # once, after cell 1

    def cell_done(cell: object, metrics: dict[str, object]) -> None:
        print(json.dumps({"cell": getattr(cell, "label", "?"), "pid": control.pid}), flush=True)
        if hold:  # a window for the test's signal, which ends the sleep (KeyboardInterrupt);
            hold.clear()  # bounded, so a lost signal fails the test instead of hanging it
            time.sleep(60)  # (CI under load took more than 10 s to send it)

    try:
        summary = run_sweep(t, control, plan, results, deadline_s=60, warmup_s=60,
                            hooks=Hooks(cell_done=cell_done))
    except KeyboardInterrupt:
        print(json.dumps({"interrupted": True, "started": control.started}), flush=True)
        return 130
    print(json.dumps({**summary, "started": control.started, "todo": len(plan.todo)}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
