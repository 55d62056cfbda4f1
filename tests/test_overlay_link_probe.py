"""The link probe: timed on the far host, over the bytes after the stream's start.

The old probe took the difference of two sends' wall times (an empty one and 8 MiB) seen from
the workstation; where a session's setup varies as much as the bytes take (a shaped 1 Gbit
link: 8 MiB in 67 ms), that difference came out at or below zero, clamped to 84 GB/s
(benchmarks/RESULTS.md, the many-core run's first try).
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import BinaryIO

import pytest

from ddtree_deploy.errors import CommandTimeout, DeployError
from ddtree_deploy.overlay import relay, wire
from ddtree_deploy.remote import overlay_link_probe
from ddtree_deploy.remote.runner import RemoteScriptTimeout
from ddtree_deploy.transport import LocalTransport
from ddtree_deploy.transport.base import Result
from ddtree_deploy.transport.command import Command

MiB = 1024 * 1024


def _probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes, skip: int,
           clock: list[float], capsys: pytest.CaptureFixture[str]) -> dict[str, float]:
    src = tmp_path / "in"
    src.write_bytes(data)
    ticks = iter(clock)
    monkeypatch.setattr(overlay_link_probe.time, "monotonic", lambda: next(ticks))
    with src.open("rb") as fh:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(fh))
        assert overlay_link_probe.main([str(skip)]) == 0
    return json.loads(capsys.readouterr().out)


def test_only_the_bytes_after_the_first_skip_are_timed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # reads of 1 MiB: the second passes 2 MiB and starts the clock (10.0), the fifth, the
    # last, stops it (10.5)
    out = _probe(tmp_path, monkeypatch, bytes(5 * MiB), 2 * MiB, [10.0, 10.1, 10.3, 10.5],
                 capsys)
    assert out == {"bytes": 3 * MiB, "seconds": 0.5, "received": 5 * MiB}


def test_a_stream_shorter_than_skip_counts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _probe(tmp_path, monkeypatch, bytes(MiB // 2), 2 * MiB, [3.0], capsys)
    assert out == {"bytes": 0, "seconds": 0.0, "received": MiB // 2}


class _Cut(LocalTransport):
    """Delivers only the first half of a command's stdin (a stream cut on the way)."""

    def run(self, cmd: Command | str, *, timeout: float | None = None) -> Result:
        if isinstance(cmd, Command) and cmd.stdin is not None:
            cmd = dataclasses.replace(cmd, stdin=cmd.stdin[: len(cmd.stdin) // 2])
        return super().run(cmd, timeout=timeout)


def test_the_probe_runs_on_the_host_and_a_cut_stream_is_an_error() -> None:
    rate = wire.measure_link(LocalTransport(host="far"), 4 * MiB, python=sys.executable)
    assert 0 < rate < float("inf")
    with pytest.raises(DeployError, match=r"measuring the link: 2097152 of 4194304 bytes"):
        wire.measure_link(_Cut(host="far"), 4 * MiB, python=sys.executable)


def test_a_probe_that_times_out_gives_the_links_upper_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(*args: object, **kwargs: object) -> dict[str, object]:
        raise RemoteScriptTimeout("far: measuring the link failed", problem="timeout")

    monkeypatch.setattr(wire, "run_json", slow)
    assert wire.measure_link(LocalTransport(host="far"), 4 * MiB, timeout=8.0) == 4 * MiB / 8.0


def test_a_link_not_measured_makes_the_stream_plain_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[dict[str, object]] = []

    def broken(t: object, *args: object, **kwargs: object) -> float:
        asked.append(kwargs)
        raise DeployError("far: measuring the link: no runnable python")

    monkeypatch.setattr(wire, "measure_link_down", broken)  # the source's: its stream's way
    monkeypatch.setattr(wire, "measure_source", lambda *a, **k: wire.Sample(True, 2.0, 5e8))
    choice = relay._source_choice(LocalTransport(host="far"), "/sp", [], [], "/v/bin/python",
                                  True, "auto", None)
    assert not choice.compress
    assert choice.reason == ("the link to far was not measured: far: measuring the link: "
                             "no runnable python")
    assert asked == [{"python": "/v/bin/python", "sudo": True}]  # as the venv's python runs


def test_the_sources_probe_times_here_the_bytes_after_the_first_quarter() -> None:
    ticks = iter([1.0, 1.5, 2.0])  # the clock is read from the write that passes the skip
    sink = overlay_link_probe.Arrivals(2 * MiB, clock=lambda: next(ticks))
    for _ in range(4):
        sink.write(bytes(MiB))  # the 2nd write passes 2 MiB: the clock starts (1.0)
    assert (sink.got, sink.counted, sink.start, sink.end) == (4 * MiB, 2 * MiB, 1.0, 2.0)
    assert wire._rate("src", sink.answer(), 4 * MiB) == 2 * MiB / 1.0
    with pytest.raises(DeployError, match="0 of 8388608 bytes"):  # nothing came
        wire._rate("src", overlay_link_probe.Arrivals(8 * MiB).answer(), 8 * MiB)


def test_the_sources_probe_runs_there_and_a_failing_python_is_an_error() -> None:
    rate = wire.measure_link_down(LocalTransport(host="src"), 4 * MiB, python=sys.executable)
    assert 0 < rate < float("inf")
    with pytest.raises(DeployError, match=r"src: measuring the link failed \(exit 1\)"):
        wire.measure_link_down(LocalTransport(host="src"), 4 * MiB, python="false")


class _Down(LocalTransport):
    """A source whose probe stream times out, or ends (exit 0) after half of its bytes."""

    def __init__(self, how: str) -> None:
        super().__init__(host="src")
        self.how = how

    def run_stream_out(self, cmd: Command | str, dst: BinaryIO, *,
                       timeout: float | None = None) -> Result:
        if self.how == "timeout":
            raise CommandTimeout("src: the command did not finish in time")
        dst.write(bytes(2 * MiB))
        return Result(command="python - send", exit_code=0, stdout="", stderr="", duration=0.1)


def test_the_sources_probe_timing_out_or_cut_short() -> None:
    assert wire.measure_link_down(_Down("timeout"), 4 * MiB, timeout=8.0) == 4 * MiB / 8.0
    with pytest.raises(DeployError, match=r"measuring the link: 2097152 of 4194304 bytes"):
        wire.measure_link_down(_Down("short"), 4 * MiB)
