"""Which phases one rehearsal call runs: ``--phase a,b`` shares one install, one payload deploy
and one start of the servers the phases name (a fresh machine's first start costs 100-170 s of
JIT, so a second call or a second start group is what a device call cannot afford).

Pure: names and server lists only; ``rehearsal.run`` does the running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

# Every phase ``rehearsal.run`` knows, in the order they run when several are named (servers'
# checks first, while the servers are fresh; bench last: it starts its own servers after the
# shared ones are stopped).
NAMES = ("correctness", "request-params", "perf", "perf-8b", "dflash-sampled", "bench")
FIRST_PORT = 31000


def parse(text: str) -> tuple[str, ...] | str:
    """``a,b`` -> the phases in run order, or what is wrong with the text (a str)."""
    named = [p.strip() for p in text.split(",")]
    if not named or any(not p for p in named):
        return f"--phase: comma-separated names among {', '.join(NAMES)}, got {text!r}"
    unknown = [p for p in named if p not in NAMES]
    if unknown:
        return f"--phase: no such phase {', '.join(unknown)} (known: {', '.join(NAMES)})"
    if len(set(named)) != len(named):
        return f"--phase: a phase named twice in {text!r}"
    return tuple(p for p in NAMES if p in named)


def union(phases: Iterable[str], servers_of: Callable[[str], Sequence[Any]]) -> list[Any] | str:
    """The servers of every phase, each once, with ports from FIRST_PORT in order.

    A server two phases name is shared when both describe it the same way (ports aside);
    one name with two descriptions is an error (a str), found before anything runs."""
    seen: dict[str, Any] = {}
    for phase in phases:
        for s in servers_of(phase):
            same = replace(s, port=0)
            if s.name in seen and seen[s.name] != same:
                return (f"--phase: server {s.name} differs between the phases named "
                        f"({seen[s.name]} vs {same})")
            seen.setdefault(s.name, same)
    return [replace(s, port=FIRST_PORT + i) for i, s in enumerate(seen.values())]
