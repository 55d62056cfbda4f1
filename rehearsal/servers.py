"""The rehearsal's servers: localhost deployments rendered by the tool, run as plain processes.

Each server is a deployment of a hosts file written for ``localhost`` (transport local): the
tool's own ``service render localhost NAME --json`` produces the unit and the argv, environment
and working directory it is written from, and the server runs exactly those
(``ddtree_deploy.service.plainproc``), so what runs is what the unit says. The GPU host has
no systemd: ``--no-verify``, and the tool's ``probe --port --pid --log-file`` reads the
server's log instead of the journal.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

FAULTS_DIR = Path(__file__).resolve().parent / "faults"

# Flags every rehearsal server takes (tiny models, several servers on one GPU, token ids).
COMMON_ARGS = (
    "--skip-tokenizer-init", "--dtype", "bfloat16", "--max-running-requests", "32",
    "--cuda-graph-max-bs", "32", "--disable-piecewise-cuda-graph", "--random-seed", "1234",
    "--decode-log-interval", "1", "--max-total-tokens", "65536",
    # An idle scheduler polls its sockets without a pause and holds a core at 100 %: with ten
    # servers on one host the one measured competed with nine spinning ones (runs 3-6).
    "--sleep-on-idle",
)  # fmt: skip
# What the GPU host needs in every server's environment (set through hosts.yaml's
# per-deployment `environment:`, so the unit carries it): no hub, tvm-ffi without torch's
# C DLPack, JIT caches under HOME (the rehearsal's scratch folder); SGLang's memory check on an
# idle scheduler raising instead of warning (a leak ends the server: seen by every later check).
SERVER_ENV = {"HF_HUB_OFFLINE": "1", "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",
              "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}

# The plugin's two verify switches (ddtree_sglang/target_attention.py), both off: the target's
# verify eager, through SGLang's extend kernel. On by default from plugin 0.3.4 (opt-in in
# 0.3.2-0.3.3, until session 8's call 1 proved them lossless with both set to 1).
PLUGIN_OFF = (("SGLANG_DDTREE_TREE_ATTENTION", "0"), ("SGLANG_DDTREE_VERIFY_GRAPH", "0"))
# On SGLang 0.5.17+ the lossless checks run the DDTREE servers on the plugin's default (both
# on); these run both switched off, so the same run keeps the eager path checked too.
PLUGIN_SWITCHED_OFF = frozenset({"ddtree31-ladder"})

@dataclass(frozen=True)
class Server:
    """One server of the rehearsal."""

    name: str
    models: str  # folder holding target/ and draft/ (a design, or dummy weights)
    algorithm: str = "none"  # none | dflash | ddtree
    budget: int | None = None
    topk: int | None = None
    shadow_linear: bool = False
    cuda_graph: bool = True
    backend: str | None = "triton"  # None: name no backend (the payload picks triton)
    fault: str | None = None  # REHEARSAL_FAULT for rehearsal/faults/sitecustomize.py
    env: tuple[tuple[str, str], ...] = ()  # more of the unit's Environment= (a payload switch)
    port: int = 0
    # SGLang sizes the KV pool as (free memory - (1 - fraction) x total): with several servers
    # on one GPU a small fraction leaves nothing for those started later, so the fraction is
    # high and --max-total-tokens caps each pool (and so each server's memory).
    mem_fraction: float = 0.95
    context_length: int = 2048
    extra: tuple[str, ...] = ()
    dummy: bool = False
    # False: the rehearsal waits for /health and one greedy answer itself instead of the tool's
    # probe, whose sampled generation hangs DFLASH on dummy weights (run 5: its sampled verify
    # never returned, and the spinning server slowed every other one on the GPU).
    tool_probe: bool = True
    # the venv's SGLang: 0.5.11 takes the patch set, 0.5.17+ the plugin (the tool renders each
    # form's argv and environment from it)
    sglang: str = "0.5.11"
    venv: str | None = None  # another venv than the rehearsal's (perf-8b: an earlier payload)

    def deployment(self, venv_ref: str) -> dict:
        dep: dict = {
            "host": "localhost", "venv": venv_ref, "cuda_lane": "cu130",
            "sglang": {"version": self.sglang}, "payload": self.algorithm == "ddtree",
            "gpu": 0, "port": self.port,
            "model_path": f"{self.models}/target", "algorithm": self.algorithm,
            "grammar_backend": "none", "mem_fraction_static": self.mem_fraction,
            "context_length": self.context_length, "cuda_graph": self.cuda_graph,
            "sampling_backend": "pytorch",
            "environment": {**SERVER_ENV, **dict(self.env)},
            "extra_args": ["--load-format", "dummy" if self.dummy else "auto",
                           *COMMON_ARGS, *self.extra],
        }  # fmt: skip
        if self.backend:
            dep["attention_backend"] = self.backend
        if self.algorithm != "none":
            dep["draft_model_path"] = f"{self.models}/draft"
        if self.algorithm == "ddtree":
            dep["ddtree"] = {"budget": self.budget, "topk": self.topk,
                             "shadow_linear": self.shadow_linear}
        return dep


def switched(specs: Sequence[Server], sglang: str) -> list[Server]:
    """``specs`` with :data:`PLUGIN_OFF` in the environment of each :data:`PLUGIN_SWITCHED_OFF`
    DDTREE server on the plugin form (SGLang other than 0.5.11), but for a variable the server
    sets itself; the others keep the plugin's default."""
    if sglang == "0.5.11":
        return list(specs)
    out = []
    for s in specs:
        if s.algorithm == "ddtree" and s.name in PLUGIN_SWITCHED_OFF:
            own = {k for k, _ in s.env}
            s = replace(s, env=(*s.env, *((k, v) for k, v in PLUGIN_OFF if k not in own)))
        out.append(s)
    return out


def hosts_file(server: Server, venv: str, folder: Path) -> Path:
    """Write a localhost hosts file whose one deployment is ``server``.

    One file per server: hosts.yaml refuses two deployments on one GPU of a host (rightly, for
    real hosts); the rehearsal shares the GPU on purpose, so each server gets its own file.
    """
    doc = {
        "version": 1,
        "hosts": {"localhost": {"transport": "local", "venvs": {
            "torch": {"path": venv, "role": "serving"}}}},
        "deployments": {server.name: server.deployment("torch")},
    }
    path = folder / f"{server.name}.hosts.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class Running:
    """A started server: its unit, command, PID and log."""

    server: Server
    unit: str
    argv: list[str]
    pid: int
    log: Path
    started: float = field(default_factory=time.monotonic)
    healthy_s: float | None = None
    probe: dict | None = None


def tool(cli: Path, hosts: Path, *args: str, timeout: float = 300.0) -> tuple[int, str, str]:
    """Run the tool's CLI; (exit code, stdout, stderr)."""
    done = subprocess.run([str(cli), "--hosts", str(hosts), *args], capture_output=True,
                          text=True, timeout=timeout, check=False)
    return done.returncode, done.stdout, done.stderr


def render(cli: Path, hosts: Path, name: str) -> dict:
    """The tool's unit and what it runs (argv, environment, working directory), as JSON."""
    code, out, err = tool(cli, hosts, "service", "render", "localhost", name, "--no-verify",
                          "--json")
    if code != 0:
        raise RuntimeError(f"service render {name} exited {code}: {err.strip()[-2000:]}")
    return results_of(out, err)


def results_of(out: str, err: str = "") -> dict:
    """What a --json run of the tool said (docs/json.md): its results, or {"error": message}
    when it failed or printed no document."""
    try:
        doc = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        return {"error": out.strip()[-2000:]}
    if not isinstance(doc, dict):
        return {"error": err.strip()[-2000:] or "no JSON document on stdout"}
    if doc.get("ok") is True and isinstance(doc.get("results"), dict):
        return dict(doc["results"])
    error = doc.get("error")
    return {"error": error.get("message") if isinstance(error, dict) else str(error)}


def start(server: Server, rendered: dict, log_dir: Path, base_env: Mapping[str, str]) -> Running:
    from ddtree_deploy.service import plainproc

    cmd = plainproc.UnitCommand(argv=tuple(rendered["argv"]), env=rendered["environment"],
                                cwd=rendered["working_directory"])
    env = dict(base_env)
    if server.fault:
        env["REHEARSAL_FAULT"] = server.fault
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(FAULTS_DIR), env.get("PYTHONPATH", "")) if p)
    log = log_dir / f"{server.name}.log"
    pid = plainproc.start(cmd, str(log), base_env=env)
    return Running(server, rendered["unit"], list(cmd.argv), pid, log)


def stop(run: Running) -> None:
    from ddtree_deploy.service import plainproc

    plainproc.stop(run.pid, timeout=20.0)


def probe(cli: Path, hosts: Path, run: Running, deadline: float) -> tuple[int, dict]:
    """The tool's probe of one running server, by port, PID and log file."""
    code, out, err = tool(
        cli, hosts, "probe", "localhost", "--port", str(run.server.port), "--pid",
        str(run.pid), "--log-file", str(run.log), "--deadline", str(deadline), "--json",
        timeout=deadline + 60,
    )  # fmt: skip
    return code, results_of(out, err)
