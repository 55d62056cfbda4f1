"""The bounded, fail-fast health probe of one SGLang service.

Each poll is ONE command on the host (remote/health.py sent on stdin), every ~0.3 s, until one of:
a failed unit, a crash loop or an exited process (unhealthy, with the crash signatures found
in the log lines of the current start), a fatal signature in the log (unhealthy at once, even
while the process still unwinds), /health 200 followed by a good short GREEDY generation and
a good short SAMPLED one (healthy: both answered), a bad generation (unhealthy: degenerate
output, far too few tokens at a very low rate, an error), or the deadline (status
"deadline", exit code 124).

The sampled generation (temperature 0.7, top-p 0.9, top-k 20) takes the path real traffic
takes: SGLang's greedy batches use argmax, and a temperature-only request torch's
multinomial; only top-p/top-k reach the sampling backend's kernels (flashinfer's JIT-compiled
ones by default), whose first use stalled a real H200 server ~100 s right after /health 200.
Each generation's wait for its first token is charged to the warm-up budget (``warmup_s``,
JIT compiles of a first start land there), everything else to the deadline; the seconds
spent warming are reported. Servers started with ``--skip-tokenizer-init`` take input_ids,
not text: /server_info says so (or the text request's refusal does), and the probe sends
token ids there.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from ddtree_deploy.errors import CommandTimeout, UsageError
from ddtree_deploy.health.signatures import Match, fill_remedy, match_line
from ddtree_deploy.health.verdict import (
    WARMUP_S,
    GenResult,
    HttpResult,
    ProbeTarget,
    Status,
    UnitState,
    Verdict,
    failed,
    judge_generation,
    unit_state,
)
from ddtree_deploy.remote.bundle import text
from ddtree_deploy.remote.runner import run_json
from ddtree_deploy.rules.findings import command
from ddtree_deploy.service.spec import ServiceSpec
from ddtree_deploy.transport.base import Transport
from ddtree_deploy.transport.command import Command

__all__ = ["SAMPLED_STALL_REMEDY", "SAMPLING", "WARMUP_S", "GenResult", "HttpResult",
           "ProbeTarget", "UnitState", "Verdict", "judge_generation", "probe_service"]

REMOTE_SCRIPT = "health.py"  # in remote/
POLL_INTERVAL_S = 0.3
GENERATE_TOKENS = 16
SAMPLE_TOKENS = 8
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 20}
# Said when the sampled generation stopped mid-way while the greedy one had answered: what the
# GPU rehearsal saw on a real H200 (benchmarks/RESULTS.md, runs 5-7).
SAMPLED_STALL_HINT = (
    "greedy requests answered, so the server's sampling path stalled. Seen with SGLang 0.5.11's "
    "DFLASH: its sampled verify never returned on dummy (near-uniform) weights, keeping the GPU "
    "busy until the server was stopped; and the first sampled request after a start took "
    "~100 s while sgl-kernel's top_k_renorm_prob loaded (once per host and HOME: the probe's "
    "warm-up budget covers it)")
SAMPLED_STALL_REMEDY = ("serve the model's real weights, or probe again with a longer --warmup: "
                        + command("probe", "{host}", "{name}", "--warmup", "600"))
GEN_LIMIT_S = 20.0  # one short generation never waits longer than this after its first token
MIN_TOK_PER_S = 2.0  # below this, with far fewer tokens than asked: unhealthy
KEEP_LINES = 2000
TAIL_LINES = 20


Kind = Literal["greedy", "sampled"]


class _Probe:
    def __init__(self, transport: Transport, target: ProbeTarget, *, deadline_s: float,
                 warmup_s: float, on_status: Callable[[str], None] | None,
                 generate_tokens: int, sample_tokens: int, min_tok_per_s: float,
                 interval_s: float, sudo: bool, python: str) -> None:
        self.transport, self.target = transport, target
        self.deadline_s, self.warmup_s, self.on_status = deadline_s, warmup_s, on_status
        self.generate_tokens, self.sample_tokens = generate_tokens, sample_tokens
        self.min_rate = min_tok_per_s
        self.interval_s, self.sudo, self.python = interval_s, sudo, python
        self.context = target.context(transport.host)
        self.lines: deque[str] = deque(maxlen=KEEP_LINES)
        self.matches: dict[str, Match] = {}
        self.cursor: str | None = None
        self.http = HttpResult()
        self.state = UnitState()
        self.first_restarts: int | None = None
        self.polls = 0
        self.start = time.monotonic()
        self.warm_used = 0.0  # seconds of first-token waits: charged to warmup_s
        self.mode = "text" if target.input_ids is False else "ids" if target.input_ids \
            else "auto"
        self.done: dict[Kind, dict[str, Any]] = {}
        self.failed_gen: tuple[Kind, dict[str, Any]] | None = None  # waits for one more poll

    # -- time: the deadline covers everything but the waits for first tokens ---------------

    def steady_left(self) -> float:
        return self.deadline_s - (time.monotonic() - self.start - self.warm_used)

    def warm_left(self) -> float:
        return self.warmup_s - self.warm_used

    def pending(self) -> Kind | None:
        if self.generate_tokens <= 0 or self.failed_gen is not None:
            return None
        if "greedy" not in self.done:
            return "greedy"
        if self.sample_tokens > 0 and "sampled" not in self.done:
            return "sampled"
        return None

    def _command(self, budget: float, kind: Kind | None, first: float, rest: float) -> Command:
        t = self.target
        args = ["--port", str(t.port), "--addr", t.addr, "--budget", f"{budget:.3f}"]
        for flag, value in (("--unit", t.unit), ("--pid", t.pid), ("--log-file", t.log_file),
                            ("--cursor", self.cursor), ("--key-file", t.key_file)):
            if value is not None:
                args += [flag, str(value)]
        if self.http.model_id is None:
            args.append("--models")
        if kind is not None:
            tokens = self.generate_tokens if kind == "greedy" else self.sample_tokens
            params = {"temperature": 0} if kind == "greedy" else SAMPLING
            args += ["--generate", str(tokens), "--sampling", json.dumps(params),
                     "--mode", self.mode, "--first-limit", f"{first:.3f}",
                     "--gen-limit", f"{rest:.3f}"]
        return Command(argv=(self.python, "-", *args), stdin=text(REMOTE_SCRIPT).encode(),
                       sudo=self.sudo)

    def poll(self, kind: Kind | None) -> dict[str, Any]:
        steady = self.steady_left()
        # Until /health has answered 200 a poll stays short (a stalled host costs little); a
        # generation that then finds no first token in time is asked again with the full budget.
        cap = self.warmup_s if self.http.health == 200 else GEN_LIMIT_S
        first = max(0.2, min(self.warm_left(), cap))
        rest = max(0.2, min(steady - 0.2, GEN_LIMIT_S))
        if kind is None:
            first, budget = 0.0, rest
        else:
            budget = first + rest + 1.0  # + /health, /v1/models, systemctl, the journal
        report = run_json(self.transport, self._command(budget, kind, first, rest),
                          timeout=budget + 2.0, what="the health poll", answers=None,
                          hint=f"the host needs {self.python} (3.8+) on PATH")
        self.polls += 1
        log = report.get("log") or {}
        self.cursor = log.get("cursor") or self.cursor
        for line in log.get("lines") or []:
            self.lines.append(line)
            match = match_line(line, self.context)
            if match is not None and match.id not in self.matches:
                self.matches[match.id] = match
        self.state = unit_state(report)
        if self.first_restarts is None:
            self.first_restarts = self.state.n_restarts
        http = report.get("http") or {}
        self.http.health, self.http.health_error = http.get("health"), http.get("health_error")
        self.http.model_id = http.get("model_id") or self.http.model_id
        info = http.get("server_info")
        if isinstance(info, dict):
            self.http.sampling_backend = info.get("sampling_backend") or None
            if self.mode == "auto" and info.get("skip_tokenizer_init"):
                self.mode = "ids"
        gen = http.get("generation")
        if isinstance(gen, dict):
            first_s = gen.get("first_s")
            waited = float(first_s) if isinstance(first_s, int | float) else (
                float(gen.get("seconds") or 0.0) if gen.get("first_timed_out") else 0.0)
            if gen.get("stalled"):  # cut in a stall after its first token: warm-up time too
                waited = float(gen.get("seconds") or 0.0)
            stall = gen.get("stall_s")  # a gap between tokens the warm-up budget covered
            waited += float(stall) if isinstance(stall, int | float) else 0.0
            self.warm_used += min(waited, first)
            if gen.get("mode") == "ids" or (gen.get("mode") == "text" and gen.get("tokens")):
                self.mode = str(gen["mode"])
        return report

    def verdict(self, status: Status, reason: str) -> Verdict:
        fatal = [m for m in self.matches.values() if m.fatal]
        other = [m for m in self.matches.values() if not m.fatal]
        diagnosis = fatal + other if status == "unhealthy" else []
        self.http.input_mode = None if self.mode == "auto" else self.mode
        return Verdict(status, reason, self.state, diagnosis, self.http,
                       time.monotonic() - self.start, self.polls, list(self.lines)[-TAIL_LINES:],
                       round(self.warm_used, 3), self.warmup_s)

    def status_line(self, elapsed: float) -> str:
        s = self.state
        if s.systemd:
            where = f"{self.target.unit}: {s.active_state}/{s.sub_state} " \
                f"restarts={s.n_restarts}"
        else:
            alive = {True: "running", False: "exited", None: "?"}[s.pid_alive]
            where = f"port {self.target.port}: pid {s.exec_main_pid or '-'} {alive}"
        health = self.http.health or self.http.health_error or "-"
        line = f"{where} · /health {health} · {elapsed - self.warm_used:.1f}s/{self.deadline_s:g}s"
        if self.warm_used > 0.05:
            line += f" · warm-up {self.warm_used:.1f}s/{self.warmup_s:g}s"
        return line

    def _deadline(self, kind: Kind | None = None, gen: dict[str, Any] | None = None) -> Verdict:
        if self.warm_left() <= 0.05:
            what = kind or self.pending() or "the"
            if gen is not None and gen.get("stalled"):  # its first token came, then nothing
                verdict = self.verdict(
                    "deadline", f"the {what} generation gave its first token, then nothing more "
                    f"within the warm-up budget of {self.warmup_s:g} s")
                self._stall_hint(verdict, kind)
                return verdict
            return self.verdict("deadline", f"no first token of the {what} generation within "
                                f"the warm-up budget of {self.warmup_s:g} s")
        return self.verdict("deadline", f"no verdict within {self.deadline_s:g} s; last seen: "
                            f"{self.last_seen()}")

    def last_seen(self) -> str:
        """What the last poll saw (/health's answer or error, the unit, the last log line):
        a deadline never hides the error it kept meeting."""
        h, s = self.http, self.state
        parts = [f"/health: {h.health_error}" if h.health_error else
                 f"/health answered {h.health}" if h.health is not None else
                 "/health never answered"]
        if s.systemd and s.active_state:
            parts.append(f"unit {s.active_state}/{s.sub_state}")
        elif s.note:
            parts.append(f"systemd: {s.note}")
        if self.lines:
            parts.append(f"last log line: {self.lines[-1].strip()[:300]}")
        return "; ".join(parts)

    def _stall_hint(self, verdict: Verdict, kind: Kind | None) -> None:
        """The sampled path stalled while greedy had answered: say what the H200 showed."""
        if kind == "sampled" and "greedy" in self.done:
            verdict.diagnosis.append(Match("sampled-path-stalled", "", SAMPLED_STALL_HINT,
                                           fill_remedy(SAMPLED_STALL_REMEDY, self.context),
                                           fatal=False))

    def run(self) -> Verdict:
        grace_used = False
        while True:
            if self.steady_left() <= 0:
                return self._deadline()
            t0 = time.monotonic()
            kind = self.pending()  # generated by the host only once /health answers 200
            try:
                report = self.poll(kind)
            except CommandTimeout:
                return self._deadline()
            if any(m.fatal for m in self.matches.values()):
                first = next(m for m in self.matches.values() if m.fatal)
                return self.verdict("unhealthy", f"crash signature {first.id}: {first.diagnosis}")
            down = failed(self.state, self.first_restarts)
            if down is not None and (self.http.health != 200 or self.failed_gen is not None):
                if not grace_used:  # the last lines may still be on their way to the journal
                    grace_used = True
                    time.sleep(0.15)
                    continue
                hints = ", ".join(self.matches) or "no known crash signature in its log"
                return self.verdict("unhealthy", f"{down}; {hints}")
            if self.failed_gen is not None:  # one more poll found the unit well: the answer
                return self._judged(*self.failed_gen)
            if self.http.health == 200:
                gen = (report.get("http") or {}).get("generation")
                if kind is not None and isinstance(gen, dict):
                    if gen.get("first_timed_out") or gen.get("stalled"):
                        if self.warm_left() <= 0.05:
                            return self._deadline(kind, gen)
                        continue  # asked again, with the warm-up budget left
                    if gen.get("error") and not gen.get("timed_out") and not gen.get("status"):
                        self.failed_gen = (kind, gen)  # did it crash? ask the unit first
                        continue
                    verdict = self._judged(kind, gen)
                    if verdict.status != "healthy":
                        return verdict
                if self.pending() is None:
                    return self._healthy()
                if kind is not None:
                    continue  # the next generation at once
            if self.on_status is not None:
                self.on_status(self.status_line(time.monotonic() - self.start))
            time.sleep(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def _judged(self, kind: Kind, gen: dict[str, Any]) -> Verdict:
        result = GenResult.from_report(gen)
        if kind == "greedy":
            self.http.greedy = result
            self.http.tokens, self.http.asked = result.tokens, result.asked
            self.http.seconds, self.http.tok_per_s = result.seconds, result.tok_per_s
            self.http.text_sample, self.http.error = result.text_sample, result.error
        else:
            self.http.sampled = result
        why = judge_generation(gen, self.min_rate)
        if why is not None:
            what = "greedy" if kind == "greedy" else "sampled"
            if kind == "sampled":
                why = why.replace("the generation", "the sampled generation")
            verdict = self.verdict("unhealthy", why if kind == "greedy" else
                                   f"{why} ({what}: {json.dumps(SAMPLING)})")
            if gen.get("timed_out"):
                self._stall_hint(verdict, kind)
            return verdict
        self.done[kind] = gen
        return self.verdict("healthy", "")

    def _healthy(self) -> Verdict:
        if not self.done:
            return self.verdict("healthy", "/health answered 200")
        parts = [f"{kind} {GenResult.from_report(gen).summary()}"
                 for kind, gen in self.done.items()]
        mode = " (input_ids)" if self.mode == "ids" else ""
        return self.verdict("healthy", f"/health 200; {'; '.join(parts)}{mode}; warm-up "
                            f"{self.warm_used:.1f} s")


def probe_service(
    transport: Transport,
    target: ServiceSpec | ProbeTarget,
    *,
    deadline_s: float,
    warmup_s: float = WARMUP_S,
    on_status: Callable[[str], None] | None = None,
    generate_tokens: int = GENERATE_TOKENS,
    sample_tokens: int = SAMPLE_TOKENS,
    min_tok_per_s: float = MIN_TOK_PER_S,
    interval_s: float = POLL_INTERVAL_S,
    sudo: bool = True,
    python: str = "python3",
) -> Verdict:
    """Probe one service until a verdict: ``deadline_s`` for everything but the waits for
    first tokens, which ``warmup_s`` bounds; one host command per poll."""
    if deadline_s <= 0:
        raise UsageError(f"the deadline must be positive, got {deadline_s:g} s")
    if warmup_s <= 0:
        raise UsageError(f"the warm-up budget must be positive, got {warmup_s:g} s")
    if isinstance(target, ServiceSpec):
        target = ProbeTarget.from_spec(target)
    probe = _Probe(transport, target, deadline_s=deadline_s, warmup_s=warmup_s,
                   on_status=on_status, generate_tokens=generate_tokens,
                   sample_tokens=sample_tokens, min_tok_per_s=min_tok_per_s,
                   interval_s=interval_s, sudo=sudo, python=python)
    return probe.run()
