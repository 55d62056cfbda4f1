"""The bench's workloads (data in workloads.json) turned into the sessions a cell sends.

A single-turn workload sends its prompts in turn, one request each; the agentic workload sends
sessions of several turns, each turn's prompt being the previous prompt, the previous answer and
a tool-style result, so the context grows as in an agent loop. For servers without a tokenizer
(`--skip-tokenizer-init`) the text becomes token ids: each word a stable id below the target's
vocabulary size (the same text gives the same ids, so configurations see the same prompts).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ddtree_deploy.errors import UsageError

DATA = Path(__file__).with_name("workloads.json")


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # single | agentic
    prompts: tuple[str, ...]
    turns: int = 1
    tool_results: tuple[str, ...] = ()


@cache
def _load() -> dict[str, Workload]:
    raw = json.loads(DATA.read_text(encoding="utf-8"))
    out = {}
    for name, w in raw.items():
        if name.startswith("_"):
            continue
        out[name] = Workload(name, w["kind"], tuple(w["prompts"]), int(w.get("turns", 1)),
                             tuple(w.get("tool_results", ())))
    return out


def names() -> tuple[str, ...]:
    return tuple(_load())


def get(name: str) -> Workload:
    try:
        return _load()[name]
    except KeyError:
        raise UsageError(f"unknown workload {name!r}; known: {', '.join(names())}") from None


def to_ids(text: str, vocab: int) -> list[int]:
    """Stable token ids for text: one per word (ids 1..vocab-1; 0 is left out)."""
    if vocab < 2:
        raise UsageError(f"vocabulary size {vocab} is too small for token-id prompts")
    ids = []
    for word in text.split():
        digest = hashlib.sha256(word.encode("utf-8")).digest()
        ids.append(1 + int.from_bytes(digest[:4], "big") % (vocab - 1))
    return ids or [1]


def sessions(name: str, count: int, *, ids: bool, vocab: int) -> list[dict[str, Any]]:
    """`count` sessions for a cell: each {"turns": [prompt...], "tools": [tool result...]}.

    Prompts are text or token-id lists; an agentic session's later turns are built on the host
    from the answers (the tool results are given here, one per turn after the first).
    """
    w = get(name)
    out = []
    for i in range(count):
        first = w.prompts[i % len(w.prompts)]
        tools = [w.tool_results[(i + t) % len(w.tool_results)] for t in range(w.turns - 1)] \
            if w.kind == "agentic" and w.tool_results else []
        if ids:
            out.append({"prompt": to_ids(first, vocab),
                        "tools": [to_ids(t, vocab) for t in tools]})
        else:
            out.append({"prompt": first, "tools": tools})
    return out
