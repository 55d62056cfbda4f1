"""Phase ``perf-8b``: a DDTree round at a realistic size (issue 28), on synthetic dummy weights.

A Qwen3-8B-shaped target (hidden 4096, 36 layers, 32/8 heads, head 128, vocabulary 151,936) and a
5-layer DFlash drafter (block 16, target layers 1, 9, 17, 25, 33), config only, loaded with
``--load-format dummy`` (random weights: no acceptance, every round commits one token, so a
round's cost is what is measured). Served side by side in one run: no speculation, DFLASH,
DDTREE 15/8 and 31/8, and, when a snapshot of an earlier payload was carried (``.payload-ab``,
``python -m rehearsal.snapshot REF``), DDTREE 15/8 on that payload too, in a copy of the venv's
sglang (``old_venv``): the A/B of the payload's changes in the same run. On SGLang 0.5.17+ (the
plugin form; no snapshot) the A/B is the same plugin with its switches: ``ddtree15-8b`` and
``ddtree31-8b`` with both verify changes on, named (``PLUGIN_AFTER``; the plugin's default from
0.3.4, opt-in in 0.3.2-0.3.3), ``ddtree15-8b-prev`` with both off (``PLUGIN_BEFORE``: the
plugin as before the changes), ``ddtree15-8b-eagerverify`` the tree kernel without
the verify graphs and ``ddtree15-8b-extendattn`` the graphs without the tree kernel.

Settings as judged: ``--attention-backend triton --sampling-backend pytorch``, CUDA graphs on.

Measured (``measure``): alternating order (the order reverses every round), ``rounds`` rounds of
batch 1, 8 and 32, greedy, ``tokens`` new tokens a request; each server timed with every other
server of the run stopped (SIGSTOP of its process group; SIGCONT after), and once more at batch 1
with the others running, to show what the stop changes. Per server and batch: tok/s, and the
round's cost (a request's e2e latency over its verify rounds; over its tokens without
speculation: a step). Then (``profiles``) SGLang's torch profiler over ``PROFILE_STEPS`` steps of
one batch-1 request per server, the others stopped: GPU busy and idle per round, host time
blocked, kernel and graph launches and host synchronisations per round. A DDTREE server of the
current payload with more than ``SYNC_LIMIT`` synchronisations a round fails the phase.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from rehearsal import client

PHASE = "perf-8b"
ROUNDS, TOKENS, BATCHES = 5, 64, (1, 8, 32)
PROFILE_STEPS = 16
# Seconds a timing round leaves to what follows it (the profiles step needs 40 and took ~12-20 s
# for 5 servers in call 3; then stopping the servers and the rollback, ~10 s): measure starts no
# round that would eat into them.
RESERVE_S = 45.0
STACKED = "ddtree15-8b"  # profiled a second time with Python stacks
# Host synchronisations a DDTREE round of the current payload may make: the one the scheduler
# needs (the accepted tokens and path, read on the host), and one for what the profiler itself
# adds at a step's edge. More fails the phase.
SYNC_LIMIT = 2
SNAPSHOT = ".payload-ab"  # at the repository root: an earlier payload, carried for the A/B
PROMPT = [11, 12, 100]
ENV = (("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE", "1"),)
# 5 big servers share one H200: each one's KV pool capped (36 layers x 8 heads x 128 x 2 x 2 B
# = 147 KiB a token: 16k tokens are 2.4 GB), batch 32 x (3 + 64 + 32) tokens fits.
EXTRA = ("--max-total-tokens", "16384")


def design() -> Any:
    """The 8B-shaped pair as a ``rehearsal.designs`` design (config only; weights are dummy)."""
    from rehearsal.designs import get_design

    return replace(get_design("ladder"), hidden_size=4096, num_layers=36, num_heads=32,
                   num_kv_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
                   draft_layers=5, block_size=16, target_layer_ids=(1, 9, 17, 25, 33),
                   mask_token_id=151669, eos_token_id=151645, bos_token_id=151643,
                   context_length=4096)


def write_models(folder: Path) -> None:
    """``folder/target/config.json`` and ``folder/draft/config.json``."""
    from rehearsal import models

    d = design()
    for part, cfg in (("target", models.target_config(d)), ("draft", models.draft_config(d))):
        (folder / part).mkdir(parents=True, exist_ok=True)
        (folder / part / "config.json").write_text(json.dumps(cfg, indent=1))


def snapshot_dir(repo: Path) -> Path | None:
    """The carried earlier payload (its payload.yaml inside), or None."""
    folder = repo / SNAPSHOT
    return folder if (folder / "payload.yaml").is_file() else None


# The plugin form (SGLang 0.5.17+) with its issue-28 changes switched off: the target's verify
# eager and SGLang's extend kernel (ddtree_sglang/target_attention.py), i.e. the plugin as it was
# before them (6ebdc14), in the same venv: the A/B of those changes in the same run.
PLUGIN_BEFORE = (("SGLANG_DDTREE_VERIFY_GRAPH", "0"), ("SGLANG_DDTREE_TREE_ATTENTION", "0"))
# ... and with both on, named explicitly on each server (the default from plugin 0.3.4, opt-in
# in 0.3.2-0.3.3): the A/B does not depend on the installed plugin release's default.
PLUGIN_AFTER = (("SGLANG_DDTREE_VERIFY_GRAPH", "1"), ("SGLANG_DDTREE_TREE_ATTENTION", "1"))


def servers(models: str, *, old_venv: str | None, sglang: str = "0.5.11") -> list[Any]:
    """The phase's servers; ``old_venv``: the venv holding the earlier payload (None: no A/B;
    the patch set's only); ``sglang``: 0.5.17+ adds the plugin's own A/B (``-prev``)."""
    from rehearsal.servers import Server

    plugin = sglang != "0.5.11"
    common: dict[str, Any] = {"dummy": True, "env": ENV, "extra": EXTRA}
    ddtree: dict[str, Any] = {**common, "env": (*ENV, *PLUGIN_AFTER)} if plugin else common
    out = [Server("nospec-8b", models, **common),
           Server("dflash-8b", models, "dflash", tool_probe=False, **common),
           Server("ddtree15-8b", models, "ddtree", 15, 8, **ddtree),
           Server("ddtree31-8b", models, "ddtree", 31, 8, **ddtree)]
    # the current payload with SGLang's extend kernel for the verify (an A/B of the tree kernel;
    # on the plugin with the verify graphs on: the graphs' share of the change)
    out.append(Server("ddtree15-8b-extendattn", models, "ddtree", 15, 8, dummy=True,
                      env=(*ENV, ("SGLANG_DDTREE_TREE_ATTENTION", "0"),
                           *(PLUGIN_AFTER[:1] if plugin else ())), extra=EXTRA))
    if plugin:
        # the plugin as before its verify changes (PLUGIN_BEFORE: both 0); and its tree
        # kernel without the verify graphs (the kernel's share of the change)
        out.append(Server("ddtree15-8b-prev", models, "ddtree", 15, 8, dummy=True,
                          env=(*ENV, *PLUGIN_BEFORE), extra=EXTRA))
        out.append(Server("ddtree15-8b-eagerverify", models, "ddtree", 15, 8, dummy=True,
                          env=(*ENV, PLUGIN_BEFORE[0], PLUGIN_AFTER[1]), extra=EXTRA))
    elif old_venv is not None:
        out.append(Server("ddtree15-8b-old", models, "ddtree", 15, 8, venv=old_venv, **common))
    return out


# --- the earlier payload's venv ----------------------------------------------------------------


def old_venv(venv: Path, dest: Path) -> Path:
    """A venv at ``dest`` holding a copy of ``venv``'s sglang (as installed: call it before the
    payload is deployed) that sees everything else of ``venv`` (a .pth adds its site-packages
    after its own): the tool deploys the earlier payload into it like into any venv."""
    if dest.exists():
        shutil.rmtree(dest)
    subprocess.run([str(venv / "bin" / "python"), "-m", "venv", "--without-pip", str(dest)],
                   check=True, capture_output=True, text=True, timeout=120)
    src = next((venv / "lib").glob("python3.*/site-packages"))
    dst = dest / "lib" / src.parent.name / "site-packages"
    shutil.copytree(src / "sglang", dst / "sglang", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for info in src.glob("sglang-*.dist-info"):
        shutil.copytree(info, dst / info.name, symlinks=True)
    (dst / "zz_base_venv.pth").write_text(f"import site; site.addsitedir({str(src)!r})\n")
    return dest


# --- timing --------------------------------------------------------------------------------------


@contextmanager
def others_stopped(pids: Mapping[str, int], keep: str) -> Iterator[None]:
    """Every server's process group but ``keep``'s stopped (SIGSTOP) inside, continued after."""
    stopped = []
    try:
        for name, pid in pids.items():
            if name != keep:
                try:
                    os.killpg(pid, signal.SIGSTOP)
                    stopped.append(pid)
                except ProcessLookupError:
                    pass
        yield
    finally:
        for pid in stopped:
            with suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)


def one(port: int, tokens: int, batch: int, timeout: float) -> dict[str, Any]:
    """One batch of greedy requests: tok/s, and the median request's cost of a round (step)."""
    t0 = time.monotonic()
    answers = client.batch(port, [PROMPT] * batch, [tokens] * batch, concurrency=batch,
                           timeout=timeout)
    wall = time.monotonic() - t0
    done = sum(len(a.output_ids) for a in answers)
    costs, accepts = [], []
    for a in answers:
        rounds = int(a.meta.get("spec_verify_ct") or 0) or len(a.output_ids)
        e2e = float(a.meta.get("e2e_latency") or 0.0)
        if rounds and e2e:
            costs.append(1000 * e2e / rounds)
        if a.meta.get("spec_accept_length") is not None:
            accepts.append(float(a.meta["spec_accept_length"]))
    return {"tok_s": done / wall if wall > 0 else 0.0,
            "round_ms": statistics.median(costs) if costs else None,
            "accept_length": statistics.median(accepts) if accepts else None,
            "errors": [a.error for a in answers if a.error][:2]}


def measure(live: Sequence[tuple[str, int]], pids: Mapping[str, int], *, rounds: int = ROUNDS,
            tokens: int = TOKENS, batches: Sequence[int] = BATCHES,
            timeout: float = 120.0, time_left: Callable[[], float] | None = None,
            reserve: float = RESERVE_S) -> dict[str, Any]:
    """``live``: (name, port). Per server and batch the runs and their medians (see module).

    ``time_left``: the call's seconds left; a round is not started when less than the last
    round took plus ``reserve`` is left (each entry says how many rounds it has). A server whose
    batch answers no token at all (it died or hangs) is not asked again (``failed``): one such
    server costs one timeout, not one a batch and round."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {n: {b: [] for b in batches}
                                                        for n, _ in live}
    failed: dict[str, list[str]] = {}

    def ask(name: str, port: int, n_tokens: int, b: int) -> dict[str, Any] | None:
        if name in failed:
            return None
        got = one(port, n_tokens, b, timeout)
        if got["errors"] and not got["tok_s"]:
            failed[name] = got["errors"]
        return got

    for name, port in live:  # warm-up, every batch size (graphs of each, first-use kernels)
        with others_stopped(pids, name):
            for b in batches:
                ask(name, port, 16, b)
    took = 0.0
    for i in range(rounds):
        before = time_left() if time_left is not None else 0.0
        if time_left is not None and i > 0 and before < took + reserve:
            break
        for name, port in (live if i % 2 == 0 else list(reversed(live))):
            if name in failed:
                continue
            with others_stopped(pids, name):
                for b in batches:
                    got = ask(name, port, tokens, b)
                    if got is not None:
                        runs[name][b].append(got)
        took = before - time_left() if time_left is not None else 0.0
    out: dict[str, Any] = {}
    for name, port in live:
        entry: dict[str, Any] = {}
        if name in failed:
            entry["failed"] = failed[name][:2]
        for b, items in runs[name].items():
            costs = [r["round_ms"] for r in items if r["round_ms"] is not None]
            entry[f"batch{b}"] = {
                "tok_s_median": (statistics.median(r["tok_s"] for r in items)
                                 if items else None),
                "tok_s": [round(r["tok_s"], 1) for r in items],
                "round_ms_median": statistics.median(costs) if costs else None,
                "round_ms": [round(c, 3) for c in costs],
                "accept_length": items[-1]["accept_length"] if items else None,
                "rounds_done": len(items),
                "errors": [e for r in items for e in r["errors"]][:3]}
        # the same batch 1 with every other server running: what stopping them changes
        running = ask(name, port, tokens, 1)
        if running is not None:
            entry["batch1_others_running"] = {"round_ms": running["round_ms"],
                                              "tok_s": running["tok_s"]}
        out[name] = entry
    return out


# --- profile summary ----------------------------------------------------------------------------


def round_profile(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Per round (a scheduler step): GPU busy and idle, host blocked, launches and syncs."""
    steps = max(1, int(summary.get("steps") or 1))
    counts = summary.get("counts") or {}
    gpu = summary.get("gpu") or {}
    window = float(summary.get("window_ms") or 0.0)
    busy = float(gpu.get("busy_ms") or 0.0)
    return {"steps": steps, "round_ms": round(window / steps, 3),
            "gpu_busy_ms": round(busy / steps, 3),
            "gpu_idle_ms": round((window - busy) / steps, 3),
            "host_blocked_ms": round(float(summary.get("blocking_ms") or 0.0) / steps, 3),
            **{f"{k}_per_round": round(float(v) / steps, 2) for k, v in counts.items()}}


def profiles(live: Sequence[tuple[str, int]], pids: Mapping[str, int], folder: Path,
             *, time_left: Any) -> dict[str, Any]:
    """One profiled batch-1 request per server (others stopped): its per-round summary."""
    from rehearsal import profile

    out: dict[str, Any] = {}
    for name, port in live:
        if time_left() < 40:
            out[name] = {"error": "no time left"}
            continue
        try:
            with others_stopped(pids, name):
                summary = profile.capture(port, folder / name, steps=PROFILE_STEPS,
                                          tokens=PROFILE_STEPS * 4 + 32,
                                          timeout=max(30.0, min(90.0, time_left() - 20)))
        except Exception as exc:  # one server's failure is its own
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[name] = {**round_profile(summary),
                     "top_kernels": (summary.get("gpu") or {}).get("top_kernels", [])[:12],
                     "runtime": summary.get("runtime", [])[:10],
                     "host_ops": (summary.get("host") or {}).get("ops_by_self", [])[:15]}
    # one DDTREE server again with Python stacks: where its host time goes (SGLang's functions
    # and the payload's by inclusive time; stacks slow the host, so timings come from above)
    name = next((n for n, _ in live if n == STACKED), None)
    if name is not None and time_left() > 60:
        try:
            with others_stopped(pids, name):
                summary = profile.capture(dict(live)[name], folder / f"{name}-stack",
                                          steps=PROFILE_STEPS // 2, tokens=PROFILE_STEPS * 2 + 32,
                                          with_stack=True, timeout=max(30.0, min(90.0,
                                                                             time_left() - 20)))
            out[f"{name}/stack"] = {"sglang_by_incl": (summary.get("host") or {})
                                    .get("sglang_by_incl", [])[:30]}
        except Exception as exc:
            out[f"{name}/stack"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def sync_verdicts(prof: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """For each DDTREE server of the current payload: its syncs per round against SYNC_LIMIT."""
    out: dict[str, Any] = {}
    for name in names:
        entry = prof.get(name) or {}
        syncs = entry.get("syncs_per_round")
        out[name] = {"syncs_per_round": syncs, "limit": SYNC_LIMIT,
                     "ok": syncs is not None and syncs <= SYNC_LIMIT}
    return out


# --- the phase, inside rehearsal.run -------------------------------------------------------------


def prepare_old(r: Any, venv: Path, work: Path, hosts: Path, snapshot: Path) -> None:
    """Before the payload is deployed: the venv copy, and the earlier payload deployed into it by
    the tool (its own deploy, checks and state), so ``ddtree15-8b-old`` runs that payload."""
    dest = old_venv(venv, work / "venv-old")
    r.tool(hosts, [("payload_deploy_old", ["payload", "deploy", "localhost", "--venv", str(dest),
                                           "--payload", str(snapshot)])])
    if r.result["tool"]["payload_deploy_old"]["exit"] != 0:
        raise RuntimeError("the earlier payload is not deployed: ddtree15-8b-old cannot run")
    source = snapshot / "SOURCE"
    r.result.setdefault("perf8b", {})["old_payload"] = (
        source.read_text().strip() if source.is_file() else str(snapshot))


def run_phase(r: Any, mine: Sequence[Any], folder: Path) -> None:
    """Time, then profile, the phase's healthy servers; the sync limit decides the last step."""
    out = r.result.setdefault("perf8b", {})
    out.update({"models": "synthetic: Qwen3-8B-shaped target, 5-layer DFlash drafter, dummy "
                          "weights (no acceptance: one token a round)",
                "settings": "--attention-backend triton --sampling-backend pytorch, CUDA graphs",
                "rounds": max(ROUNDS, r.rounds), "tokens": TOKENS, "batches": list(BATCHES),
                "sync_limit": SYNC_LIMIT})
    live = [(s.name, s.port) for s in mine if r.healthy(s.name)]
    for s in mine:
        if not r.healthy(s.name):
            r.result["not_run"].append({"step": f"{PHASE} {s.name}", "why": "not healthy"})
    pids = {name: run.pid for name, run in r.running.items()}

    def timings() -> None:
        out["timings"] = measure(live, pids, rounds=max(ROUNDS, r.rounds),
                                 timeout=max(30.0, min(60.0, r.left() - 20)), time_left=r.left)

    def profiled() -> None:
        out["profiles"] = profiles(live, pids, folder, time_left=r.left)

    def syncs() -> None:
        names = [s.name for s in mine if s.algorithm == "ddtree" and s.venv is None]
        out["syncs"] = sync_verdicts(out.get("profiles") or {}, names)
        bad = {n: v["syncs_per_round"] for n, v in out["syncs"].items() if not v["ok"]}
        if bad:
            raise RuntimeError(f"host syncs per round above {SYNC_LIMIT} (or not measured): {bad}")

    if not live:
        r.result["not_run"].append({"step": PHASE, "why": "no healthy server"})
        return
    r.step(f"{PHASE} timings", timings, need=60)
    r.step(f"{PHASE} profiles", profiled, need=40)
    r.step(f"{PHASE} syncs", syncs)
