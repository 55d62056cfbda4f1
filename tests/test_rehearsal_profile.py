"""The rehearsal's profile summary (rehearsal/profile.py) on a real torch profiler trace (CPU) and
on GPU-shaped events whose answer is known by construction."""

from __future__ import annotations

from pathlib import Path

import pytest

from rehearsal import profile

torch = pytest.importorskip("torch")


def test_summary_of_a_real_cpu_trace_counts_and_nests_the_ops(tmp_path: Path) -> None:
    x = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                with_stack=True) as prof:
        for _ in range(7):
            (x @ x).relu().sum()
    trace = tmp_path / "t.json"
    prof.export_chrome_trace(str(trace))
    summary = profile.summarize(profile.load(trace), steps=7, top=100)

    ops = {row["name"]: row for row in summary["host"]["ops_by_self"]}
    assert ops["aten::mm"]["count"] == 7
    assert ops["aten::relu"]["count"] == 7
    # relu's own time excludes the clamp_min it calls
    assert ops["aten::relu"]["self_ms"] < ops["aten::relu"]["incl_ms"]
    assert all(row["self_ms"] >= 0 for row in ops.values())
    # Python functions are reported by name without the object's address
    py = [row["name"] for row in summary["host"]["python_by_self"]]
    assert py and not any(" at 0x" in name for name in py)
    assert summary["gpu"]["kernels"] == 0 and summary["runtime"] == []
    # each Python function's self time is its time outside its Python callees (parent ids)
    py_rows = summary["host"]["python_by_self"]
    assert all(row["self_ms"] >= 0 for row in py_rows)


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_gpu_busy_is_the_union_and_blocking_calls_are_summed() -> None:
    events = [
        _x("cpu_op", "step", 0, 1000),
        _x("cuda_runtime", "cudaLaunchKernel", 10, 5),
        _x("cuda_runtime", "cudaGraphLaunch", 20, 15),
        _x("cuda_runtime", "cudaMemcpyAsync", 100, 300),
        _x("cuda_runtime", "cudaStreamSynchronize", 500, 200),
        # the GPU: two overlapping kernels (100-300 and 200-400) and a copy (600-650)
        _x("kernel", "k1", 100, 200, tid=7),
        _x("kernel", "k2", 200, 200, tid=8),
        _x("gpu_memcpy", "Memcpy DtoH", 600, 50, tid=7),
        {"ph": "M", "name": "process_name", "pid": 1},  # metadata, not a span
    ]
    s = profile.summarize(events, steps=2)
    assert s["window_ms"] == pytest.approx(1.0)
    assert s["gpu"]["busy_ms"] == pytest.approx(0.35)  # 100-400 and 600-650
    assert s["gpu"]["idle_ms"] == pytest.approx(0.65)
    assert s["gpu"]["kernels"] == 2 and s["gpu"]["copies"] == 1
    # only the synchronize blocks: cudaMemcpyAsync enqueues (its wait shows as a synchronize)
    assert s["blocking_ms"] == pytest.approx(0.2)
    calls = {row["name"]: row for row in s["runtime"]}
    assert calls["cudaGraphLaunch"]["count"] == 1 and calls["cudaLaunchKernel"]["per_step"] == 0.5
    assert s["host"]["ops_by_self"][0] == {"name": "step", "count": 1, "incl_ms": 1.0,
                                           "self_ms": 1.0}


def test_an_empty_trace_says_so() -> None:
    s = profile.summarize([{"ph": "M", "name": "x"}], steps=3)
    assert s["window_ms"] == 0.0 and s["per_step_ms"] is None


def test_self_times_of_a_known_tree_sum_to_its_root_and_overlaps_are_clipped() -> None:
    events = [
        _x("cpu_op", "P", 0, 100), _x("cpu_op", "Y", 10, 10), _x("cpu_op", "C", 15, 75),
        _x("cpu_op", "Q", 200, 50), _x("cpu_op", "Z", 210, 20),
    ]
    ops = {r["name"]: r for r in profile.summarize(events, steps=1)["host"]["ops_by_self"]}
    # C starts inside Y and outlives it: not Y's child (Y's self stays 0.01 ms, not negative),
    # but P's; P's self is its time outside Y and C
    assert ops["Y"]["self_ms"] == pytest.approx(0.010)
    assert ops["C"]["self_ms"] == pytest.approx(0.075)
    assert ops["P"]["self_ms"] == pytest.approx(0.100 - 0.010 - 0.075)
    assert ops["Q"]["self_ms"] + ops["Z"]["self_ms"] == pytest.approx(ops["Q"]["incl_ms"])


def _py(name: str, ts: float, dur: float, pid_: int, parent: int | None) -> dict:
    e = _x("python_function", name, ts, dur)
    e["args"] = {"Python id": pid_, "Python parent id": parent}
    return e


def test_python_frames_nest_by_their_ids_not_their_times() -> None:
    """Two Python threads share one tid in SGLang's traces (a watchdog beside the scheduler):
    by time the scheduler's loop would look like a child of the watchdog."""
    events = [
        _py("watchdog.py(1): _watchdog", 0, 1000, 1, None),
        _py("scheduler.py(1): event_loop", 5, 990, 2, None),
        _py("scheduler.py(2): run_batch", 10, 600, 3, 2),
        _py("worker.py(3): forward", 20, 500, 4, 3),
    ]
    rows = {r["name"]: r for r in profile.summarize(events, steps=1)["host"]["python_by_self"]}
    assert rows["watchdog.py(1): _watchdog"]["self_ms"] == pytest.approx(1.0)  # no children
    assert rows["scheduler.py(1): event_loop"]["self_ms"] == pytest.approx(0.39)
    assert rows["scheduler.py(2): run_batch"]["self_ms"] == pytest.approx(0.1)
    assert rows["worker.py(3): forward"]["self_ms"] == pytest.approx(0.5)
