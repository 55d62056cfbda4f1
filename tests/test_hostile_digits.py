"""Numbers in text from hosts and files: "²" is a digit to str.isdigit but no number to int().

Each parser below checked its text with isdigit() and then called int(): a unit whose port
line says "²", an nvidia-smi row, /proc/meminfo or a compute capability with it, or an
`extra_args` value such as `--max-running-requests ²`, raised ValueError (a traceback in
doctor, plan or the host's probe) instead of being read as "no number". Unit tier: the
parsers are called directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ddtree_deploy.converge.steps.service_probe import unit_port
from ddtree_deploy.remote.facts_parse import parse_meminfo
from ddtree_deploy.rules.checks import _cuda_tuple, _int_head
from ddtree_deploy.rules.deploy_checks import _flag_int

SUPERSCRIPT_TWO = "\u00b2"

# (case, the parser called on hostile text, what it must give: nothing read)
CASES: list[tuple[str, Callable[[], Any], Any]] = [
    ("unit-port-line", lambda: unit_port(f"[Unit]\nX-DDTreeDeploy-Port={SUPERSCRIPT_TWO}\n"),
     None),
    ("driver-major", lambda: _int_head(f"{SUPERSCRIPT_TWO}.1"), None),
    ("cuda-version", lambda: _cuda_tuple(f"12.{SUPERSCRIPT_TWO}"), None),
    ("meminfo", lambda: parse_meminfo(f"MemTotal: {SUPERSCRIPT_TWO} kB\nMemFree: 5 kB\n"),
     {"MemFree": 5}),
    ("extra-args-flag", lambda: _flag_int(["--max-running-requests", SUPERSCRIPT_TWO],
                                          "--max-running-requests"), None),
]


@pytest.mark.parametrize(("case", "parse", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_digit_that_is_no_number_is_not_read(case: str, parse: Callable[[], Any],
                                               expected: Any) -> None:
    assert parse() == expected


def test_plain_numbers_are_still_read() -> None:
    assert unit_port("[Unit]\nX-DDTreeDeploy-Port=30001\n") == 30001
    assert _cuda_tuple("12.8") == (12, 8)
    assert _flag_int(["--max-running-requests", "48"], "--max-running-requests") == 48
