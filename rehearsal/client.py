"""A small, bounded HTTP client for SGLang's /generate in token-id mode (stdlib only).

Requests go to 127.0.0.1 only (the rehearsal's own servers); every call has a timeout, and a
batch runs at most ``concurrency`` requests at once.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

HOST = "127.0.0.1"


@dataclass
class Answer:
    """One /generate answer (or its failure)."""

    output_ids: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    chunks: int = 0  # streamed: data lines received
    chunk_gaps: list[float] = field(default_factory=list)  # streamed: seconds between chunks


def generate(port: int, input_ids: Sequence[int], max_new_tokens: int, *,
             sampling: dict[str, Any] | None = None, stream: bool = False,
             timeout: float = 120.0) -> Answer:
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                              "ignore_eos": True}
    params.update(sampling or {})
    body = json.dumps({"input_ids": list(input_ids), "sampling_params": params,
                       "stream": stream}).encode()
    req = urllib.request.Request(f"http://{HOST}:{port}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    answer = Answer()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            if not stream:
                data = json.loads(resp.read())
                answer.output_ids = list(data.get("output_ids") or [])
                answer.meta = data.get("meta_info") or {}
            else:
                last = t0
                for raw in resp:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    now = time.monotonic()
                    answer.chunk_gaps.append(now - last)
                    last = now
                    answer.chunks += 1
                    data = json.loads(payload)
                    answer.output_ids = list(data.get("output_ids") or answer.output_ids)
                    answer.meta = data.get("meta_info") or answer.meta
    except (urllib.error.URLError, OSError, ValueError) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
    answer.seconds = time.monotonic() - t0
    return answer


def batch(port: int, prompts: Sequence[Sequence[int]], lengths: Sequence[int], *,
          concurrency: int, sampling: dict[str, Any] | None = None, stream: bool = False,
          timeout: float = 180.0) -> list[Answer]:
    """Send every prompt (with its output length), ``concurrency`` at a time, in order."""
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = [pool.submit(generate, port, p, n, sampling=sampling, stream=stream,
                               timeout=timeout) for p, n in zip(prompts, lengths, strict=True)]
        return [f.result() for f in futures]


def get_json(port: int, path: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as resp:
        return json.loads(resp.read())
