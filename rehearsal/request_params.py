"""The request-parameter phase (issue 25): every request is served exactly or refused.

Servers (the ladder design: a bigram target whose greedy path and sampling law are known in
closed form; ``rehearsal.designs``), all with ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1``:
no speculation (the reference), DFLASH (the anchor: measured, not required to pass), DDTREE 15/8
with CUDA graphs, DDTREE 31/8 without, and two negative controls (graphs off, 15/8) that must
FAIL: ``topk-shortcut`` (payload 0.2.2's dense shortcut keyed on the largest top-k) and
``admit-penalties`` (penalties let through admission and ignored, as 0.2.2 did).

Checks, per server, all in mixed concurrent batches:
* ``refusals``: each refused contract row (penalties, min_new_tokens, logit_bias, a custom logit
  processor, logprobs, a grammar) on /generate and /v1/completions, streamed and not: HTTP 400
  naming the parameter and DDTREE, no token (a 200 whose stream carries the error fails); the
  neutral value is served. (Chat needs a template: tests/test_plugin_http_admission.py.)
* ``greedy``: 48 requests mixing max_new_tokens 1-12 and 16-64, stop_token_ids taken from the
  closed-form path (the output must end there), neutral penalties as OpenAI clients send them,
  EOS honoured (ignore_eos false; some true), 8 streamed; output ids equal to no speculation's,
  request by request.
* ``parallel-n``: 8 of those requests with n 2 (SGLang first sends a max_new_tokens 0 request to
  cache the prefix, then the copies), last of the token checks (a crash there costs no other).
* ``topk-mix``: 16 requests with top-k 2 beside 16 leaving top-k unset (temperature 8, top-p 1):
  768 sampled transitions of the top-k 2 rows; one token outside the target's top 2 fails (the
  old shortcut puts nearly all of them outside), and so does a share of transitions to the
  filtered law's top-1 more than 4 standard deviations from its expectation (z, as the
  correctness phase's sampling law: a sampler that follows the argmax or ignores a filter's
  renormalisation moves it by tens of deviations at these sizes).
  Then, in a second wave (a top-p or min-p row in the batch would hide the old shortcut), 8 rows
  top-p 0.5 and 8 rows min-p 0.3 beside 8 unset ones (support checked the same way).
* ``penalty``: frequency_penalty 1.5 on greedy requests: DDTREE must refuse (400); a server that
  answers must answer what no speculation answers.
* ``multiturn``: a second turn that extends the first turn's prompt and answer (the radix cache
  holds the prefix): equal to no speculation's.
* ``abort``: 8 streams closed after 2 chunks, then a greedy request still exact.
* ``leaks``: after the checks, the server's log holds no leak report and the process is alive.

Sample sizes: the filter checks are support checks (a single draw outside the kept set fails),
so their power is the chance the fault shows at least once: with 768 transitions and a fault
that puts each outside with probability > 0.5, a miss is < 2^-768. The greedy checks compare
every token. DDTREE's sampled distribution against the target's law is the correctness phase's
(``checks.sampling_law``).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

STRICT = (("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE", "1"),)
HOT = 8.0

# Refused contract rows: (parameter, sampling_params or request fields, neutral counterpart)
REFUSED: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("frequency_penalty", {"sampling_params": {"frequency_penalty": 1.5}},
     {"sampling_params": {"frequency_penalty": 0.0}}),
    ("presence_penalty", {"sampling_params": {"presence_penalty": 0.7}},
     {"sampling_params": {"presence_penalty": 0.0}}),
    ("repetition_penalty", {"sampling_params": {"repetition_penalty": 1.3}},
     {"sampling_params": {"repetition_penalty": 1.0}}),
    ("logit_bias", {"sampling_params": {"logit_bias": {"101": 5.0}}},
     {"sampling_params": {"logit_bias": {}}}),
    ("custom_logit_processor", {"custom_logit_processor": "{\"callable\": \"x\"}"},
     {"custom_logit_processor": None}),
    ("return_logprob", {"return_logprob": True}, {"return_logprob": False}),
    ("regex", {"sampling_params": {"regex": "[0-9]+"}}, {"sampling_params": {"regex": None}}),
    # last: SGLang 0.5.11 itself crashes on min_new_tokens > 0 with --skip-tokenizer-init (its
    # min-new-tokens penalizer reads req.tokenizer, None in token-id mode: call 1, rp-dflash)
    ("min_new_tokens", {"sampling_params": {"min_new_tokens": 4}},
     {"sampling_params": {"min_new_tokens": 0}}),
)


def servers(models: str) -> list[Any]:
    from rehearsal.servers import Server

    lad = f"{models}/ladder"
    return [
        Server("rp-nospec", lad, env=STRICT),
        Server("rp-dflash", lad, "dflash", env=STRICT),
        Server("rp-ddtree15", lad, "ddtree", 15, 8, env=STRICT),
        Server("rp-ddtree31-nograph", lad, "ddtree", 31, 8, cuda_graph=False, env=STRICT),
        Server("rp-ddtree15-topkfault", lad, "ddtree", 15, 8, cuda_graph=False,
               fault="topk-shortcut", env=STRICT),
        Server("rp-ddtree15-penaltyfault", lad, "ddtree", 15, 8, cuda_graph=False,
               fault="admit-penalties", env=STRICT),
    ]


REFERENCE = "rp-nospec"
MUST_FAIL = ("rp-ddtree15-topkfault", "rp-ddtree15-penaltyfault")
ANCHOR = ("rp-dflash",)


def post(port: int, path: str, body: dict[str, Any], timeout: float = 60.0
         ) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except Exception as exc:  # a dead server, a cut stream (http.client.IncompleteRead)
        return -1, f"{type(exc).__name__}: {exc}"


def _body(fields: dict[str, Any], stream: bool) -> dict[str, Any]:
    sp = {"max_new_tokens": 8, "temperature": 0.0, **fields.get("sampling_params", {})}
    extra = {k: v for k, v in fields.items() if k != "sampling_params"}
    return {"input_ids": [11, 12, 100], "sampling_params": sp, "stream": stream, **extra}


# The OpenAI completions names of SGLang's fields (protocol.py's CompletionRequest, 0.5.11)
V1_NAMES = {"min_new_tokens": "min_tokens", "return_logprob": "logprobs"}


def _v1_body(fields: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    flat = {**fields.get("sampling_params", {}),
            **{k: v for k, v in fields.items() if k != "sampling_params"}}
    body: dict[str, Any] = {"model": "default", "prompt": [11, 12, 100], "max_tokens": 8,
                            "temperature": 0.0, "stream": stream}
    for key, value in flat.items():
        body[V1_NAMES.get(key, key)] = 1 if key == "return_logprob" else value
    return body


# (row key, streamed): /generate and /v1/completions, each streamed and not
ROUTES = (("generate", False), ("generate-stream", True), ("v1", False), ("v1-stream", True))


def refusals(port: int, ddtree: bool) -> dict[str, Any]:
    """Each refused row on three routes; ok: refused naming it and DDTREE (DDTREE servers) and
    the neutral value served."""
    rows: dict[str, Any] = {}
    ok = True
    for name, fields, neutral in REFUSED:
        got: dict[str, Any] = {}
        for route, stream in ROUTES:
            if route.startswith("v1"):
                status, text = post(port, "/v1/completions", _v1_body(fields, stream))
            else:
                status, text = post(port, "/generate", _body(fields, stream))
            named = name in text and "DDTREE" in text
            refused_right = status == 400 and named and '"output_ids"' not in text
            got[route] = {"status": status, "named": named, "text": text[:300]}
            if ddtree and not refused_right:
                ok = False
        status, text = post(port, "/generate", _body(neutral, False))
        got["neutral"] = {"status": status, "text": text[:200]}
        if ddtree and status != 200:
            ok = False
        rows[name] = got
    return {"ok": ok, "rows": rows}


def _greedy_jobs(design: Any, seed: int) -> list[dict[str, Any]]:
    from rehearsal.designs import expected

    rng = random.Random(seed)
    safe = [t for t in range(10, design.hidden_size - 2) if t != design.poison]
    jobs = []
    for i in range(48):
        prompt = [rng.choice(safe) for _ in range(rng.randint(2, 40))]
        if i % 3 == 0:
            prompt[-1] = 100
        n = rng.randint(1, 12) if i % 2 else rng.randint(16, 64)
        sp: dict[str, Any] = {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": False}
        path = expected(design, prompt, n)
        if i % 4 == 1 and len(path) > 2:
            sp["stop_token_ids"] = [path[len(path) // 2]]
        if i % 5 == 0:
            sp.update(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0)
        if i % 7 == 3:
            sp["ignore_eos"] = True
        jobs.append({"input_ids": prompt, "sampling_params": sp, "stream": i % 6 == 0})
    return jobs


def _outputs(port: int, jobs: list[dict[str, Any]]) -> list[Any]:
    def one(job: dict[str, Any]) -> Any:
        if job.get("stream"):  # the last event's output_ids (client.generate reads the stream)
            from rehearsal import client

            ans = client.generate(port, job["input_ids"], job["sampling_params"]["max_new_tokens"],
                                  sampling=job["sampling_params"], stream=True, timeout=120)
            return ({"status": -1, "text": ans.error[:200]} if ans.error else ans.output_ids)
        status, text = post(port, "/generate", job, timeout=120)
        if status != 200:
            return {"status": status, "text": text[:200]}
        data = json.loads(text)
        if isinstance(data, list):  # n > 1: one answer per copy
            return [d.get("output_ids") for d in data]
        return data.get("output_ids")

    with ThreadPoolExecutor(max_workers=32) as pool:
        return list(pool.map(one, jobs))


def greedy(port: int, reference: list[Any], jobs: list[dict[str, Any]]) -> dict[str, Any]:
    got = _outputs(port, jobs)
    wrong = [i for i, (a, b) in enumerate(zip(got, reference, strict=True)) if a != b]
    stopped = sum(1 for j, g in zip(jobs, got, strict=True) if "stop_token_ids" in
                  j["sampling_params"] and isinstance(g, list) and g
                  and g[-1] in j["sampling_params"]["stop_token_ids"])
    return {"ok": not wrong, "requests": len(jobs), "wrong": wrong[:10],
            "wrong_count": len(wrong),
            "ended_on_stop_id": stopped,
            "with_stop_id": sum("stop_token_ids" in j["sampling_params"] for j in jobs)}


# (the unset rows carry a sampling_seed: served, with the target's law, as without speculation)
KINDS: dict[str, dict[str, Any]] = {"top_k 2": {"top_k": 2}, "top_p 0.5": {"top_p": 0.5},
                                   "min_p 0.3": {"min_p": 0.3}, "unset": {"sampling_seed": 7}}
# Two waves, one after the other: top-k 2 beside rows that leave everything unset (a batch with
# a top-p or min-p row takes the sorted path, which would hide the old shortcut), then top-p and
# min-p rows beside unset ones. (kind, requests) per wave.
WAVES = ((("top_k 2", 16), ("unset", 16)), (("top_p 0.5", 8), ("min_p 0.3", 8), ("unset", 8)))


def topk_mix(port: int, logits: Any, seed: int = 3) -> dict[str, Any]:
    """Rows with top-k 2, top-p 0.5 or min-p 0.3 in batches with rows leaving all unset; every
    sampled transition checked against the kept set of its row's filters."""
    import torch

    from rehearsal import checks

    raw = torch.softmax(logits / HOT, dim=-1)
    floors, top1, top1_p = {}, {}, {}
    for kind, f in KINDS.items():
        kept = checks.filtered_probs(raw, top_k=f.get("top_k", -1), top_p=f.get("top_p", 1.0),
                                     min_p=f.get("min_p", 0.0))
        floors[kind] = torch.where(kept > 0, raw, torch.inf).min(dim=-1).values
        top1[kind] = kept.argmax(dim=-1)
        top1_p[kind] = kept.max(dim=-1).values
    rng = random.Random(seed)

    def one(job: tuple[str, list[int]]) -> tuple[str, list[int], Any]:
        kind, prompt = job
        sp = {"max_new_tokens": 48, "temperature": HOT, "ignore_eos": True, **KINDS[kind]}
        status, text = post(port, "/generate", {"input_ids": prompt, "sampling_params": sp},
                            timeout=120)
        return kind, prompt, (json.loads(text).get("output_ids") if status == 200 else None)

    answers = []
    for wave in WAVES:
        jobs = [(kind, [rng.randrange(10, 99), 100]) for kind, n in wave for _ in range(n)]
        rng.shuffle(jobs)
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            answers += list(pool.map(one, jobs))
    out: dict[str, Any] = {k: {"transitions": 0, "outside": 0, "failed": 0, "top1": 0.0,
                               "top1_expected": 0.0, "var": 0.0} for k in KINDS}
    for kind, prompt, ids in answers:
        if ids is None:
            out[kind]["failed"] += 1
            continue
        seq = prompt[-1:] + ids
        row = out[kind]
        for prev, nxt in zip(seq, seq[1:], strict=False):
            row["transitions"] += 1
            # ties with the smallest kept probability may be cut by either sort: not counted
            if float(raw[prev, nxt]) < float(floors[kind][prev]) * (1 - 1e-5):
                row["outside"] += 1
            # the statistic: transitions to the filtered law's top-1, against its expectation
            p1 = float(top1_p[kind][prev])
            row["top1"] += 1.0 if nxt == int(top1[kind][prev]) else 0.0
            row["top1_expected"] += p1
            row["var"] += p1 * (1 - p1)
    for row in out.values():
        var = row.pop("var")
        row["z"] = ((row["top1"] - row["top1_expected"]) / math.sqrt(var) if var > 0
                    else 0.0 if row["top1"] == row["top1_expected"] else float("inf"))
    ok = all(v["outside"] == 0 and v["failed"] == 0 and abs(v["z"]) < 4.0 for v in out.values())
    return {"ok": ok, "temperature": HOT, **out}


def penalty(port: int, jobs: list[dict[str, Any]], reference: list[Any],
            unpenalised: list[Any], ddtree: bool) -> dict[str, Any]:
    """frequency_penalty 1.5: refused (400 naming it) or served as no speculation serves it;
    DDTREE must refuse. An error (a dead server) fails it."""
    got = _outputs(port, jobs)
    refused = sum(1 for g in got if isinstance(g, dict) and g.get("status") == 400
                  and "frequency_penalty" in g.get("text", ""))
    right = sum(1 for g, r in zip(got, reference, strict=True) if isinstance(g, list) and g == r)
    wrong = sum(1 for g, r in zip(got, reference, strict=True) if isinstance(g, list) and g != r)
    failed = len(jobs) - refused - right - wrong
    return {"ok": wrong == 0 and failed == 0 and (refused == len(jobs) if ddtree else True),
            "requests": len(jobs), "refused": refused, "served_right": right,
            "served_wrong": wrong, "failed": failed,
            "reference_changed_by_penalty": sum(1 for a, b in zip(reference, unpenalised,
                                                                   strict=True) if a != b)}


def multiturn(port: int, design: Any, reference: list[Any] | None = None) -> dict[str, Any]:
    rng = random.Random(9)
    turns = []
    for _ in range(8):
        first = [rng.randrange(10, 99) for _ in range(rng.randint(20, 60))] + [100]
        a = post(port, "/generate", {"input_ids": first, "sampling_params": {
            "max_new_tokens": 24, "temperature": 0.0}})
        one = json.loads(a[1]).get("output_ids", []) if a[0] == 200 else None
        second = first + (one or []) + [rng.randrange(10, 99), 100]
        b = post(port, "/generate", {"input_ids": second, "sampling_params": {
            "max_new_tokens": 24, "temperature": 0.0}})
        two = json.loads(b[1]).get("output_ids", []) if b[0] == 200 else None
        turns.append([one, two])
    ok = reference is None or turns == reference
    return {"ok": ok and all(t[0] is not None and t[1] is not None for t in turns),
            "turns": turns}


def abort(port: int, design: Any) -> dict[str, Any]:
    from rehearsal.designs import expected

    def cut(i: int) -> int:
        body = {"input_ids": [20 + i, 100], "sampling_params": {
            "max_new_tokens": 400, "temperature": 0.0, "ignore_eos": True}, "stream": True}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        chunks = 0
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                for raw in resp:
                    if raw.startswith(b"data:"):
                        chunks += 1
                    if chunks >= 2:
                        break  # the connection closes: SGLang aborts the request
        except (urllib.error.URLError, OSError):
            return -1
        return chunks

    with ThreadPoolExecutor(max_workers=8) as pool:
        cuts = list(pool.map(cut, range(8)))
    time.sleep(2.0)
    prompt = [33, 100]
    status, text = post(port, "/generate", {"input_ids": prompt, "sampling_params": {
        "max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}})
    after = json.loads(text).get("output_ids") if status == 200 else None
    return {"ok": all(c == 2 for c in cuts) and after == expected(design, prompt, 32),
            "chunks_before_cut": cuts, "after_status": status}


# SGLang 0.5.11 (scheduler_runtime_checker_mixin.py): "<pool> memory leak detected!", raised
# as an error with SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1 (the scheduler then dies).
LEAK_MARKS = ("memory leak detected",)


def leaks(log: Path, unit: Path, pid: int | None) -> dict[str, Any]:
    """No leak report in the server's log, the server alive, the strict check in its unit."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    found = [m for m in LEAK_MARKS if m in text]
    alive = bool(pid) and os.path.exists(f"/proc/{pid}")
    strict = unit.is_file() and "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1" in unit.read_text()
    return {"ok": not found and alive and strict, "found": found, "alive": alive,
            "strict_check_in_unit": strict}


def verdict(checks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The phase passes when every real DDTREE server passes every check and every negative
    control fails at least one; DFLASH is measured, not judged."""
    per: dict[str, bool] = {}
    for key, value in checks.items():
        if not key.startswith("request-params/") or key.count("/") != 2:
            continue
        _, server, _ = key.split("/")
        per[server] = per.get(server, True) and bool(value.get("ok"))
    ddtree = [s for s in per if s.startswith("rp-ddtree") and s not in MUST_FAIL]
    controls = {s: per.get(s) for s in MUST_FAIL}
    ok = (bool(ddtree) and all(per[s] for s in ddtree)
          and all(v is False for v in controls.values()))
    return {"ok": ok, "servers": per, "controls_failed": {s: v is False
                                                          for s, v in controls.items()},
            "anchor": {s: per.get(s) for s in ANCHOR}}


def run_phase(r: Any, mine: list[Any], work: Path) -> None:
    """The phase's checks on its started servers (``rehearsal.run`` starts them)."""
    from rehearsal import checks as ck
    from rehearsal.designs import get_design

    lad = get_design("ladder")
    port = {s.name: s.port for s in mine}
    live = [s.name for s in mine if r.healthy(s.name)]
    out = r.result["checks"]
    if REFERENCE not in live:
        r.result["not_run"].append({"step": "request-params", "why": "no reference server"})
        return
    logits = ck.transition_logits(work / "models" / "ladder" / "target")
    jobs = _greedy_jobs(lad, seed=5)
    reference = _outputs(port[REFERENCE], jobs)
    pen_jobs = [{**j, "stream": False, "sampling_params": {
        **j["sampling_params"], "frequency_penalty": 1.5, "max_new_tokens": 40}} for j in jobs[:16]]
    plain = [{**j, "stream": False, "sampling_params": {**j["sampling_params"],
                                                        "max_new_tokens": 40}} for j in jobs[:16]]
    pen_ref, pen_plain = _outputs(port[REFERENCE], pen_jobs), _outputs(port[REFERENCE], plain)
    turns_ref = multiturn(port[REFERENCE], lad)["turns"]
    n_jobs = [{**j, "stream": False, "sampling_params": {**j["sampling_params"], "n": 2}}
              for j in jobs[1:17:2]]
    n_ref = _outputs(port[REFERENCE], n_jobs)

    def one(name: str) -> None:
        ddtree = name.startswith("rp-ddtree")
        p = port[name]
        steps = (("greedy", lambda: greedy(p, reference, jobs)),
                 ("topk-mix", lambda: topk_mix(p, logits)),
                 ("penalty", lambda: penalty(p, pen_jobs, pen_ref, pen_plain, ddtree)),
                 ("multiturn", lambda: multiturn(p, lad, turns_ref)),
                 ("abort", lambda: abort(p, lad)),
                 ("parallel-n", lambda: greedy(p, n_ref, n_jobs)),
                 # last: a server without admission that serves these rows may die of one
                 ("refusals", lambda: refusals(p, ddtree)))
        for step, fn in steps:
            if r.left() < 25:
                r.result["not_run"].append({"step": f"request-params {name} {step}",
                                            "why": f"{r.left():.0f} s left"})
                continue
            try:
                out[f"request-params/{name}/{step}"] = fn()
            except Exception as exc:  # one check's failure is its own
                out[f"request-params/{name}/{step}"] = {"ok": False, "error": f"{exc!r}"[:500]}
            r.save(logs=False)

    others = [n for n in live if n != REFERENCE]
    with ThreadPoolExecutor(max_workers=max(1, len(others))) as pool:
        list(pool.map(one, others))
    # the reference's own checks (its filters and its log), after the others' load
    out[f"request-params/{REFERENCE}/topk-mix"] = topk_mix(port[REFERENCE], logits)
    time.sleep(3.0)  # idle: the strict memory check runs
    for s in mine:
        if s.name in live:
            run = r.running.get(s.name)
            out[f"request-params/{s.name}/leaks"] = leaks(
                r.logs / f"{s.name}.log", r.logs / f"{s.name}.service", run.pid if run else None)
    out["request-params/verdict"] = verdict(out)
    r.save(logs=False)


def sample_size_note() -> str:
    """Why the sizes suffice (written next to the results)."""
    miss = 0.5 ** 768
    return (f"top-k 2 support: 16 x 48 = 768 transitions; a fault that puts a draw outside "
            f"with p > 0.5 goes unseen with probability < {miss:.1e}; greedy: every token of "
            f"48 requests compared (log10 of 2^-768 = {math.log10(2) * -768:.0f})")
