"""SGLang's HTTP endpoints, answered by the stand-in (no model runs here).

Text is derived deterministically from the prompt (a hash picks words), the
requested token limits are honoured, and answers take as long as a real server
on the story's hardware would roughly take: ~40 tok/s plain, ~120 tok/s with
DFlash, a bit more with DDTree. ``meta_info`` and ``/server_info`` carry the
speculative accept lengths the way real SGLang reports them.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ddtree_lab_standin.http import BadRequest, Request, Response, Route

TOKEN_RATE = {"NONE": 40.0, "DFLASH": 120.0, "DDTREE": 140.0}
OTHER_SPEC_RATE = 90.0
ACCEPT_BASE = {"DFLASH": 3.2, "DDTREE": 4.0}
OTHER_ACCEPT_BASE = 2.6
_WORDS = (
    "the", "model", "answers", "with", "a", "short", "deterministic", "passage", "drawn",
    "from", "prompt", "so", "that", "every", "request", "returns", "same", "words", "for",
    "input", "while", "speculative", "decoding", "changes", "only", "how", "fast", "tokens",
    "arrive", "and", "many", "drafted", "target", "accepts", "per", "verify", "step", "on",
    "this", "lab", "host",
)


def _seed(prompt: str) -> int:
    return int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big")


def generate_words(prompt: str, limit: int | None) -> tuple[list[str], str]:
    """Deterministic words for a prompt and the finish reason ('length'/'stop')."""
    seed = _seed(prompt)
    natural = 12 + seed % 96
    count = natural if limit is None else max(0, min(limit, natural))
    words = [_WORDS[(seed >> (i % 48) ^ (i * 2654435761)) % len(_WORDS)] for i in range(count)]
    reason = "length" if limit is not None and limit < natural else "stop"
    return words, reason


def prompt_tokens(prompt: str) -> int:
    return max(1, (len(prompt.encode("utf-8")) + 3) // 4)


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
    warmup_s: float = 1.5
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _accept_sum: float = 0.0
    _accept_n: int = 0
    _last_throughput: float = 0.0

    @property
    def speculative(self) -> bool:
        return self.algorithm != "NONE"

    def ready(self) -> bool:
        return time.monotonic() - self.started >= self.warmup_s

    def rate(self) -> float:
        return TOKEN_RATE.get(self.algorithm, OTHER_SPEC_RATE)

    def accept_length(self, prompt: str) -> float:
        base = ACCEPT_BASE.get(self.algorithm, OTHER_ACCEPT_BASE)
        return round(base + (_seed(prompt) % 61) / 100.0, 2)

    def run(self, prompt: str, limit: int | None) -> dict[str, Any]:
        """Generate, taking real-looking time; returns text and meta_info."""
        t0 = time.monotonic()
        words, reason = generate_words(prompt, limit)
        n = len(words)
        time.sleep(0.02 + n / self.rate())
        elapsed = time.monotonic() - t0
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": n}
            if reason == "length"
            else {"type": "stop", "matched": 151645},
            "prompt_tokens": prompt_tokens(prompt),
            "completion_tokens": n,
            "cached_tokens": 0,
            "e2e_latency": round(elapsed, 4),
        }
        if self.speculative and n:
            accept = self.accept_length(prompt)
            meta["spec_verify_ct"] = max(1, round(n / accept))
            meta["spec_accept_length"] = accept
            with self._lock:
                self._accept_sum += accept
                self._accept_n += 1
        with self._lock:
            self._last_throughput = n / elapsed if elapsed > 0 else 0.0
        text = (" " + " ".join(words)) if words else ""
        return {"text": text, "reason": reason, "meta_info": meta}

    def avg_accept_length(self) -> float:
        with self._lock:
            return round(self._accept_sum / self._accept_n, 3) if self._accept_n else 0.0

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


def _prompt(value: Any, what: str) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a string")
    return value


def routes(state: ServerState) -> dict[tuple[str, str], Route]:
    """The endpoint table for the stand-in SGLang server."""

    def health(_: Request) -> Response:
        return Response(200, b"") if state.ready() else Response(503, b"")

    def health_generate(_: Request) -> Response:
        if not state.ready():
            return Response(503, b"")
        state.run("health check", 1)
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
        internal: dict[str, Any] = {"last_gen_throughput": state.last_throughput()}
        if state.speculative:
            internal["avg_spec_accept_length"] = state.avg_accept_length()
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
        out = state.run(_prompt(body.get("text"), "text"), 128 if limit is None else limit)
        return Response(200, {"text": out["text"].lstrip(), "meta_info": out["meta_info"]})

    def completions(req: Request) -> Response:
        body = req.json()
        limit = _limit(body, "max_tokens")
        out = state.run(_prompt(body.get("prompt"), "prompt"), 16 if limit is None else limit)
        choice = {
            "index": 0,
            "text": out["text"],
            "logprobs": None,
            "finish_reason": out["reason"],
            "matched_stop": None,
        }
        return Response(200, _openai(state, "text_completion", "cmpl", choice, out))

    def chat(req: Request) -> Response:
        body = req.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        parts = [str(m.get("content", "")) for m in messages if isinstance(m, dict)]
        out = state.run("\n".join(parts), _limit(body, "max_completion_tokens", "max_tokens"))
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": out["text"].lstrip(),
                "reasoning_content": None,
                "tool_calls": None,
            },
            "logprobs": None,
            "finish_reason": out["reason"],
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
