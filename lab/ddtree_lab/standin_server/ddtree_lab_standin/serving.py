"""SGLang's HTTP endpoints, answered by the stand-in (no model runs here).

Text is derived deterministically from the prompt (a hash picks words); with
``--skip-tokenizer-init`` requests carry ``input_ids`` and answers ``output_ids``
only, as real SGLang 0.5.11 does (a text prompt is refused with its error). The
requested token limits are honoured; ``stream: true`` answers SSE lines
``data: {...}`` (cumulative ``output_ids``/``text``, ``finish_reason`` null until
the last) and ``data: [DONE]`` as SGLang's /generate. ``meta_info`` has the real
fields and types (id, finish_reason, prompt_tokens, weight_version,
total_retractions, reasoning_tokens, completion_tokens, cached_tokens,
cached_tokens_details, dp_rank, e2e_latency, and with speculation spec_accept_rate,
spec_accept_length, spec_accepted_drafts, spec_proposed_drafts, spec_verify_ct, as
tokenizer_manager.py computes them; response_sent_to_client_ts).

Timing and acceptance are SYNTHETIC (speedmodel.py): answers take as long as the
rounds of a made-up cost model that depends on the algorithm, budget, top-k, block
size and the number of requests running at once.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ddtree_lab_standin.http import BadRequest, Request, Response, Route
from ddtree_lab_standin.speedmodel import SpeedModel

EOS_ID = 151645
_WORDS = (
    "the", "model", "answers", "with", "a", "short", "deterministic", "passage", "drawn",
    "from", "prompt", "so", "that", "every", "request", "returns", "same", "words", "for",
    "input", "while", "speculative", "decoding", "changes", "only", "how", "fast", "tokens",
    "arrive", "and", "many", "drafted", "target", "accepts", "per", "verify", "step", "on",
    "this", "lab", "host",
)
NO_TEXT = ("The engine initialized with skip_tokenizer_init=True cannot accept text prompts. "
           "Please provide input_ids or re-initialize the engine with skip_tokenizer_init=False.")


def _seed(prompt: str) -> int:
    return int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big")


def natural_length(key: str) -> int:
    return 12 + _seed(key) % 96


def generate_words(prompt: str, limit: int | None, ignore_eos: bool = False
                   ) -> tuple[list[str], str]:
    """Deterministic words for a prompt and the finish reason ('length'/'stop')."""
    seed = _seed(prompt)
    natural = 1 << 30 if ignore_eos else natural_length(prompt)
    count = natural if limit is None else max(0, min(limit, natural))
    words = [_WORDS[(seed >> (i % 48) ^ (i * 2654435761)) % len(_WORDS)] for i in range(count)]
    reason = "length" if limit is not None and limit < natural else "stop"
    return words, reason


def generate_ids(key: str, count: int, vocab: int) -> list[int]:
    seed = _seed(key)
    return [((seed >> (i % 40)) + i * 7919) % vocab for i in range(count)]


def prompt_tokens(prompt: str) -> int:
    return max(1, (len(prompt.encode("utf-8")) + 3) // 4)


def dumps(value: Any) -> bytes:
    """Compact JSON, as orjson writes it."""
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True)
class Prompt:
    key: str  # what the deterministic output and the acceptance factor derive from
    text: str | None
    ids: list[int] | None

    @property
    def tokens(self) -> int:
        return len(self.ids) if self.ids is not None else prompt_tokens(self.text or "")


@dataclass
class ServerState:
    """What the endpoints report; filled by launch_server after the checks."""

    args: dict[str, Any]
    version: str
    model_path: str
    served_model_name: str
    model_type: str
    architectures: list[str]
    algorithm: str  # NONE, DFLASH, DDTREE, EAGLE, ...
    context_length: int
    skip_tokenizer_init: bool = False
    vocab_size: int = 151936
    speed: SpeedModel = field(default_factory=SpeedModel)
    warmup_s: float = 1.5
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _accept_sum: float = 0.0
    _accept_n: int = 0
    _last_throughput: float = 0.0
    _active: int = 0

    @property
    def speculative(self) -> bool:
        return self.algorithm != "NONE"

    def ready(self) -> bool:
        return time.monotonic() - self.started >= self.warmup_s

    def active(self) -> int:
        with self._lock:
            return self._active

    def stream(self, prompt: Prompt, limit: int | None, sampled: bool = False,
               ignore_eos: bool = False) -> Iterator[dict[str, Any]]:
        """One answer round by round: each item is the cumulative answer so far."""
        t0 = time.monotonic()
        if prompt.ids is not None:
            natural = 1 << 30 if ignore_eos else natural_length(prompt.key)
            n = natural if limit is None else max(0, min(limit, natural))
            reason = "length" if limit is not None and limit < natural else "stop"
            ids, words = generate_ids(prompt.key, n, self.vocab_size), None
        else:
            words, reason = generate_words(prompt.text or "", limit, ignore_eos)
            n = len(words)
            ids = generate_ids(prompt.key, n, self.vocab_size)
        accept = self.speed.accept_length(sampled, prompt.key)
        rid = uuid.uuid4().hex
        with self._lock:
            self._active += 1
        done = rounds = 0
        try:
            time.sleep(0.02)  # prefill
            while True:
                if done < n:
                    time.sleep(self.speed.round_seconds(self.active()))
                    rounds += 1
                    done = min(n, max(done + 1, int(accept * rounds)))
                final = done >= n
                yield self._answer(prompt, rid, ids[:done], words[:done] if words is not None
                                   else None, reason if final else None, rounds,
                                   time.monotonic() - t0 if final else None)
                if final:
                    break
        finally:
            with self._lock:
                self._active -= 1
        elapsed = time.monotonic() - t0
        with self._lock:
            self._last_throughput = n / elapsed if elapsed > 0 else 0.0
            if self.speculative and rounds:
                self._accept_sum += n / rounds
                self._accept_n += 1

    def run(self, prompt: Prompt | str, limit: int | None, sampled: bool = False,
            ignore_eos: bool = False) -> dict[str, Any]:
        """The whole answer at once (its last streamed state)."""
        if isinstance(prompt, str):
            prompt = Prompt(prompt, prompt, None)
        chunks = list(self.stream(prompt, limit, sampled, ignore_eos))
        return chunks[-1]

    def _answer(self, prompt: Prompt, rid: str, ids: list[int], words: list[str] | None,
                reason: str | None, rounds: int, elapsed: float | None) -> dict[str, Any]:
        n = len(ids)
        finish: dict[str, Any] | None = None
        if reason == "length":
            finish = {"type": "length", "length": n}
        elif reason == "stop":
            finish = {"type": "stop", "matched": EOS_ID}
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": finish, "prompt_tokens": prompt.tokens,
            "weight_version": "default", "total_retractions": 0, "reasoning_tokens": 0,
            "completion_tokens": n, "cached_tokens": 0, "cached_tokens_details": None,
            "dp_rank": None,
        }
        if elapsed is not None:
            meta["e2e_latency"] = elapsed
            if self.speculative and rounds:
                proposed = rounds * (self.speed.width - 1)
                accepted = n - rounds
                if proposed > 0:
                    meta["spec_accept_rate"] = accepted / proposed
                    meta["spec_accept_length"] = n / rounds
                    meta["spec_accepted_drafts"] = accepted
                    meta["spec_proposed_drafts"] = proposed
                    meta["spec_verify_ct"] = rounds
        meta["response_sent_to_client_ts"] = time.time()
        out: dict[str, Any] = {}
        if not self.skip_tokenizer_init:
            out["text"] = " ".join(words or [])
        out["output_ids"] = list(ids)
        out["meta_info"] = meta
        return out

    def avg_accept_length(self) -> float | None:
        with self._lock:
            return self._accept_sum / self._accept_n if self._accept_n else None

    def last_throughput(self) -> float:
        with self._lock:
            return round(self._last_throughput, 2)


def _limit(body: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BadRequest(f"{key} must be a non-negative integer, got {value!r}")
            return value
    return None


def _one_prompt(value: Any, what: str) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a string")
    return value


def _ids(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise BadRequest("input_ids must be a list of non-negative integers")
    return value


def _prompts(state: ServerState, body: dict[str, Any]) -> tuple[list[Prompt], bool]:
    """The request's prompts and whether it was a batch (a list of prompts)."""
    if body.get("input_ids") is not None:
        value = body["input_ids"]
        if isinstance(value, list) and value and isinstance(value[0], list):
            return [Prompt(repr(_ids(v)), None, _ids(v)) for v in value], True
        ids = _ids(value)
        return [Prompt(repr(ids), None, ids)], False
    if state.skip_tokenizer_init:
        raise BadRequest(NO_TEXT)
    text = body.get("text")
    if isinstance(text, list) and len(text) > 1:
        return [Prompt(t, _one_prompt(t, "text"), None) for t in text], True
    one = _one_prompt(text, "text")
    return [Prompt(one, one, None)], False


def _sampled(params: dict[str, Any]) -> bool:
    value = params.get("temperature", 1.0)  # SGLang's default temperature is 1.0
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"temperature must be a non-negative number, got {value!r}")
    return float(value) > 0


def _sse(chunks: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    try:
        for chunk in chunks:
            yield b"data: " + dumps(chunk) + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # a client that left ends its request's rounds


def routes(state: ServerState) -> dict[tuple[str, str], Route]:
    """The endpoint table for the stand-in SGLang server."""

    def health(_: Request) -> Response:
        return Response(200, b"") if state.ready() else Response(503, b"")

    def health_generate(_: Request) -> Response:
        if not state.ready():
            return Response(503, b"")
        state.run(Prompt("health check", None if state.skip_tokenizer_init else "health check",
                         [0] if state.skip_tokenizer_init else None), 1, False)
        return Response(200, b"")

    def model_info(_: Request) -> Response:
        return Response(
            200,
            {
                "model_path": state.model_path,
                "tokenizer_path": state.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": state.model_type,
                "architectures": state.architectures,
            },
        )

    def server_info(_: Request) -> Response:
        internal: dict[str, Any] = {**state.args, "last_gen_throughput": state.last_throughput()}
        accept = state.avg_accept_length()
        if state.speculative and accept is not None:
            internal["avg_spec_accept_length"] = accept
        internal["memory_usage"] = {"weight": 0.01, "kvcache": 1.0,
                                    "token_capacity": state.context_length * 16, "graph": 0.04}
        internal["effective_max_running_requests_per_dp"] = state.args.get(
            "max_running_requests") or 0
        return Response(
            200, {**state.args, "version": state.version, "internal_states": [internal]}
        )

    def models(_: Request) -> Response:
        return Response(
            200,
            {
                "object": "list",
                "data": [
                    {
                        "id": state.served_model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": state.served_model_name,
                        "parent": None,
                        "max_model_len": state.context_length,
                    }
                ],
            },
        )

    def generate(req: Request) -> Response:
        body = req.json()
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        limit = _limit(params, "max_new_tokens")
        limit = 128 if limit is None else limit
        sampled, ignore_eos = _sampled(params), bool(params.get("ignore_eos", False))
        prompts, batch = _prompts(state, body)
        if body.get("stream"):
            if batch:
                raise BadRequest("the lab's stand-in streams one prompt per request")
            chunks = state.stream(prompts[0], limit, sampled, ignore_eos)
            return Response(200, _sse(chunks), content_type="text/event-stream")
        outs = [state.run(p, limit, sampled, ignore_eos) for p in prompts]
        return Response(200, dumps(outs if batch else outs[0]))

    def completions(req: Request) -> Response:
        body = req.json()
        if state.skip_tokenizer_init:
            raise BadRequest(NO_TEXT)
        limit = _limit(body, "max_tokens")
        prompt = _one_prompt(body.get("prompt"), "prompt")
        out = state.run(prompt, 16 if limit is None else limit, _sampled(body))
        choice = {
            "index": 0,
            "text": (" " + out["text"]) if out["text"] else "",
            "logprobs": None,
            "finish_reason": out["meta_info"]["finish_reason"]["type"],
            "matched_stop": None,
        }
        return Response(200, _openai(state, "text_completion", "cmpl", choice, out))

    def chat(req: Request) -> Response:
        body = req.json()
        if state.skip_tokenizer_init:
            raise BadRequest(NO_TEXT)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        parts = [str(m.get("content", "")) for m in messages if isinstance(m, dict)]
        out = state.run("\n".join(parts), _limit(body, "max_completion_tokens", "max_tokens"),
                        _sampled(body))
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": out["text"],
                "reasoning_content": None,
                "tool_calls": None,
            },
            "logprobs": None,
            "finish_reason": out["meta_info"]["finish_reason"]["type"],
            "matched_stop": None,
        }
        return Response(200, _openai(state, "chat.completion", "chatcmpl", choice, out))

    table: dict[tuple[str, str], Route] = {
        ("GET", "/health"): health,
        ("GET", "/health_generate"): health_generate,
        ("GET", "/model_info"): model_info,
        ("GET", "/get_model_info"): model_info,
        ("GET", "/server_info"): server_info,
        ("GET", "/get_server_info"): server_info,
        ("GET", "/v1/models"): models,
        ("POST", "/generate"): generate,
        ("POST", "/v1/completions"): completions,
        ("POST", "/v1/chat/completions"): chat,
    }
    return table


def _openai(
    state: ServerState, kind: str, prefix: str, choice: dict[str, Any], out: dict[str, Any]
) -> dict[str, Any]:
    meta = out["meta_info"]
    return {
        "id": f"{prefix}-{meta['id']}",
        "object": kind,
        "created": int(time.time()),
        "model": state.served_model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": meta["prompt_tokens"],
            "completion_tokens": meta["completion_tokens"],
            "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
        },
        "metadata": {"weight_version": "default"},
    }
