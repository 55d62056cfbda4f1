"""fan_out: one function per host in parallel, outcomes as data, and Ctrl-C that ends it at once.

A real SIGINT reaches this process's main thread while a host's work is blocked (as a connect
to a host that never answers is, for up to its connect timeout): fan_out raises
KeyboardInterrupt then, not once the blocked host gives up, and leaves no host queued behind it
to be served, not even once the blocked host returns and its worker is free. Before, a thread
pool joined its workers (and served its queued hosts) first.
"""

from __future__ import annotations

import signal
import threading
import weakref
from collections.abc import Iterator

import pytest
from hang_guard import HANG_GUARD_S

from ddtree_deploy.errors import DeployError, ExitCode
from ddtree_deploy.transport.fanout import exit_code, fan_out


@pytest.fixture()
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here (as from a terminal), whatever was inherited."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_outcomes_in_the_hosts_order_with_errors_as_data() -> None:
    def fn(host: str) -> str:
        if host == "b":
            raise DeployError("b is down")
        return host.upper()

    outcomes = fan_out(["a", "b", "c"], fn, concurrency=2)
    assert [(o.host, o.value, str(o.error) if o.error else None) for o in outcomes] == [
        ("a", "A", None), ("b", None, "b is down"), ("c", "C", None)]
    assert exit_code(outcomes) == ExitCode.PARTIAL


def test_a_bug_in_one_host_is_raised_in_the_caller() -> None:
    def fn(host: str) -> str:
        raise ValueError(f"bug on {host}")

    with pytest.raises(ValueError, match="bug on"):
        fan_out(["a"], fn)


class _Mark:
    """An object that lives as long as the worker thread that holds it."""


def test_ctrl_c_ends_it_while_a_host_is_blocked(sigint_raises: None) -> None:
    started = threading.Event()
    release = threading.Event()
    served: list[str] = []
    finished: list[str] = []
    # The worker's end, seen as its thread-local data freed: Thread.join() cannot tell it here,
    # as CPython 3.11 marks a thread stopped when a Ctrl-C interrupts a join() of it
    worker_ended = threading.Event()
    per_worker = threading.local()

    def fn(host: str) -> str:
        served.append(host)
        if not hasattr(per_worker, "mark"):
            per_worker.mark = _Mark()
            weakref.finalize(per_worker.mark, worker_ended.set)
        started.set()
        release.wait(HANG_GUARD_S)  # a host that never answers (a hang guard, not a bound)
        finished.append(host)
        return host

    main = threading.main_thread().ident
    assert main is not None

    def ctrl_c() -> None:
        if started.wait(HANG_GUARD_S):
            signal.pthread_kill(main, signal.SIGINT)

    sender = threading.Thread(target=ctrl_c, daemon=True)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            fan_out(["slow", "queued1", "queued2"], fn, concurrency=1)
        assert finished == []  # it returned while the host was still blocked
        assert served == ["slow"]  # and the queued hosts were not served
        release.set()  # the blocked host answers at last: its worker ends there
        assert worker_ended.wait(HANG_GUARD_S)
        assert served == ["slow"]  # not the queued hosts, even once the worker was free
        assert finished == ["slow"]
    finally:
        release.set()
        sender.join()
