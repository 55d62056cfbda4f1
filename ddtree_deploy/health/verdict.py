"""What the health probe reports, and the pure judgments it makes of one poll's report.

The target (a unit, or a PID and log file on a host without systemd), the unit's state, each
short generation, the HTTP answers and the verdict (healthy, unhealthy or deadline, with its
exit code); `unit_state`, `judge_generation` and `failed` read one report of remote/health.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ddtree_deploy.errors import ExitCode
from ddtree_deploy.health.signatures import Match
from ddtree_deploy.service.spec import ServiceSpec

Status = Literal["healthy", "unhealthy", "deadline"]
WARMUP_S = 300.0  # default warm-up budget: waits for first tokens (JIT compiles)


@dataclass(frozen=True)
class ProbeTarget:
    """What the probe looks at. ``pid``/``log_file`` serve hosts without systemd."""

    port: int
    unit: str | None = None
    pid: int | None = None
    log_file: str | None = None
    addr: str = "127.0.0.1"
    host: str | None = None
    name: str | None = None
    venv: str | None = None
    deployment: str | None = None
    # True: the server takes input_ids only (--skip-tokenizer-init); None: ask /server_info
    input_ids: bool | None = None
    key_file: str | None = None  # its --config file on the host: the probe sends its API key

    @classmethod
    def from_spec(cls, spec: ServiceSpec) -> ProbeTarget:
        from ddtree_deploy.service import endpoint

        return cls(port=spec.port, unit=spec.unit_name, host=spec.host, name=spec.name,
                   venv=spec.venv, deployment=spec.deployment,
                   input_ids=True if "--skip-tokenizer-init" in spec.extra_args else None,
                   addr="127.0.0.1" if endpoint.is_open(spec.bind_host) else spec.bind_host,
                   key_file=endpoint.config_file(spec.name) if "api_key" in spec.secrets
                   else None)

    def context(self, host: str) -> dict[str, object]:
        return {"host": self.host or host, "name": self.name or (self.unit or "").removesuffix(
            ".service") or None, "venv": self.venv, "port": self.port,
            "deployment": self.deployment}


@dataclass
class UnitState:
    systemd: bool = False
    note: str | None = None  # e.g. "systemd unavailable"
    active_state: str | None = None
    sub_state: str | None = None
    n_restarts: int | None = None
    exec_main_status: int | None = None
    exec_main_pid: int | None = None
    invocation_id: str | None = None
    active_enter_monotonic_us: int | None = None
    pid_alive: bool | None = None  # without systemd: the given PID


@dataclass
class GenResult:
    """One short generation as the probe saw it."""

    tokens: int | None = None
    asked: int | None = None
    seconds: float | None = None
    first_token_s: float | None = None  # charged to the warm-up budget
    tok_per_s: float | None = None
    text_sample: str | None = None
    ids_sample: list[int] | None = None  # token-id mode
    mode: str | None = None  # "text" or "ids"
    sampling: dict[str, Any] | None = None
    error: str | None = None

    @classmethod
    def from_report(cls, gen: dict[str, Any]) -> GenResult:
        tokens, ids = gen.get("tokens"), gen.get("ids")
        return cls(tokens=tokens if isinstance(tokens, int) else None, asked=_int(gen.get("asked")),
                   seconds=gen.get("seconds"), first_token_s=gen.get("first_s"),
                   tok_per_s=gen.get("tok_per_s"), text_sample=str(gen.get("text") or "")[:200],
                   ids_sample=[int(i) for i in ids[:16] if isinstance(i, int)]
                   if isinstance(ids, list) else None,
                   mode=gen.get("mode"), sampling=gen.get("params") or None,
                   error=gen.get("error"))

    def summary(self) -> str:
        return (f"{self.tokens} tokens in {self.seconds or 0.0:.2f} s "
                f"({self.tok_per_s or 0.0:.1f} tok/s)")


@dataclass
class HttpResult:
    health: int | None = None
    health_error: str | None = None
    model_id: str | None = None
    input_mode: str | None = None  # "text", or "ids" for a --skip-tokenizer-init server
    sampling_backend: str | None = None  # from /server_info
    # the greedy generation (kept at the top level, as before the sampled one existed)
    tokens: int | None = None
    asked: int | None = None
    seconds: float | None = None
    tok_per_s: float | None = None
    text_sample: str | None = None
    error: str | None = None
    greedy: GenResult | None = None
    sampled: GenResult | None = None


@dataclass
class Verdict:
    status: Status
    reason: str
    unit: UnitState = field(default_factory=UnitState)
    diagnosis: list[Match] = field(default_factory=list)
    http: HttpResult = field(default_factory=HttpResult)
    elapsed_s: float = 0.0
    polls: int = 0
    log_tail: list[str] = field(default_factory=list)
    warmup_s: float = 0.0  # seconds the generations waited for their first tokens
    warmup_budget_s: float = WARMUP_S

    @property
    def exit_code(self) -> int:
        return {"healthy": ExitCode.OK, "unhealthy": ExitCode.FAILED,
                "deadline": ExitCode.DEADLINE}[self.status]

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "exit_code": int(self.exit_code), "reason": self.reason,
                "unit": asdict(self.unit), "diagnosis": [m.to_json() for m in self.diagnosis],
                "http": asdict(self.http), "elapsed_s": round(self.elapsed_s, 3),
                "warmup_s": round(self.warmup_s, 3),
                "warmup_budget_s": self.warmup_budget_s,
                "polls": self.polls, "log_tail": self.log_tail}


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def unit_state(report: dict[str, Any]) -> UnitState:
    sd = report.get("systemd") or {}
    proc = report.get("process") or {}
    state = UnitState(systemd=bool(sd.get("available")), note=sd.get("error"))
    if state.systemd:
        state.active_state = sd.get("ActiveState") or None
        state.sub_state = sd.get("SubState") or None
        state.n_restarts = _int(sd.get("NRestarts"))
        state.exec_main_status = _int(sd.get("ExecMainStatus"))
        state.exec_main_pid = _int(sd.get("ExecMainPID"))
        state.invocation_id = sd.get("InvocationID") or None
        state.active_enter_monotonic_us = _int(sd.get("ActiveEnterTimestampMonotonic"))
    if proc:
        state.pid_alive = bool(proc.get("alive"))
        state.exec_main_pid = _int(proc.get("pid"))
    return state


def judge_generation(gen: dict[str, Any], min_tok_per_s: float) -> str | None:
    """Why a short generation shows an unhealthy server, or None when it looks fine.

    The rate is the one after the first token where the answer was streamed (the wait for
    the first token is warm-up, judged by its own budget)."""
    asked = int(gen.get("asked") or 0)
    tokens = gen.get("tokens")
    seconds = float(gen.get("seconds") or 0.0)
    steady = gen.get("steady_tok_per_s")
    rate = float(steady if steady is not None else gen.get("tok_per_s") or 0.0)
    text = str(gen.get("text") or "")
    if gen.get("error") and not gen.get("timed_out"):
        return f"the generation failed: {gen['error']}"
    if gen.get("status") not in (None, 200):
        return f"the generation answered HTTP {gen['status']}"
    squeezed = "".join(text.split())
    if len(squeezed) >= 4 and len(set(squeezed)) == 1:
        return f"degenerate output: one character repeated ({squeezed[:16]!r})"
    ids = gen.get("ids")
    if isinstance(ids, list) and len(ids) >= 4 and set(ids) == {0}:
        # argmax over all-NaN logits is index 0 (Qwen's "!": the story's "!!!!" output)
        return "degenerate output: token id 0 repeated (what NaN logits give)"
    count = tokens if isinstance(tokens, int) else 0
    if gen.get("timed_out") and count < asked:
        return (f"the generation gave {count} of {asked} tokens in {seconds:.1f} s "
                "(timed out)")
    if count == 0:
        return "the generation returned no tokens"
    if rate < min_tok_per_s and count < asked / 2:
        return (f"far fewer tokens than asked at a very low rate: {count} of {asked} tokens "
                f"in {seconds:.1f} s ({rate:.2f} tok/s)")
    return None


def failed(state: UnitState, first_restarts: int | None) -> str | None:
    """Why the unit or process is down (crashed, crash loop, stopped), or None."""
    if state.systemd:
        active, sub = state.active_state, state.sub_state
        code = state.exec_main_status
        if active == "failed":
            return f"the unit failed ({sub}, exit status {code})"
        if active == "activating" and sub == "auto-restart":
            return f"the service exited (status {code}) and systemd is restarting it"
        restarts = state.n_restarts
        if first_restarts is not None and restarts is not None and restarts > first_restarts:
            return (f"the service restarted {restarts - first_restarts} time(s) during the "
                    "probe (crash loop)")
        if active == "inactive":
            return f"the unit is not running (inactive/{sub}, exit status {code})"
        return None
    if state.pid_alive is False:
        return f"the process {state.exec_main_pid} exited"
    return None
