import json
import math

import pandas as pd
import torch
from trace_model import EXPECTED_FALLBACKS

from neuron_workbench.backends import get_backend
from neuron_workbench.compare.profile_diff import DIFF_COLUMNS, profile_diff, top_ops
from neuron_workbench.trace.profile import op_profiler
from neuron_workbench.trace.profile_data import OpProfile, combined_chrome_trace, write_chrome_trace

# Ops of the cell and their exact call counts, the same on both backends: the dispatch recorder
# sees each op once even on the emulated device (no wrapper/inner doubling).
EXPECTED_CALLS = {
    "aten::convolution": 2,
    "aten::max_pool2d_with_indices": 2,
    "aten::addmm": 2,
    "aten::sort": 3,
    "aten::convolution_backward": 1,
    "aten::max_pool2d_with_indices_backward": 1,
}


def _profiles(profiled_runs):
    _, runs = profiled_runs
    return {name: run.extras["profile"] for name, run in runs.items()}


def test_profile_rows_exist_for_the_ops_of_both_runs(profiled_runs):
    for name, profile in _profiles(profiled_runs).items():
        assert profile.backend == name
        calls = {row.op: row.calls for row in profile.rows}
        assert {op: calls.get(op) for op in EXPECTED_CALLS} == EXPECTED_CALLS, name
        for row in profile.rows:
            assert row.calls > 0
            assert 0 <= row.self_time_s <= row.total_time_s
            assert row.bytes_allocated >= 0
        # slowest first
        times = [row.self_time_s for row in profile.rows]
        assert times == sorted(times, reverse=True)


def test_bytes_count_fresh_outputs_only(profiled_runs):
    profile = _profiles(profiled_runs)["neuron"]
    # conv output [2, 4, 14, 14] float32, twice
    assert profile.row("convolution").bytes_allocated == 2 * 2 * 4 * 14 * 14 * 4
    # max_pool2d_with_indices returns values (f32) and indices (i64) of [2, 4, 7, 7]
    pool_bytes = 2 * (2 * 4 * 7 * 7) * (4 + 8)
    assert profile.row("aten::max_pool2d_with_indices").bytes_allocated == pool_bytes
    # views allocate nothing
    assert profile.row("aten::view").bytes_allocated == 0
    assert profile.row("aten::t").bytes_allocated == 0
    conv = profile.row("aten::convolution")
    assert conv.shapes == "[2, 3, 16, 16] f32, [4, 3, 3, 3] f32, [4] f32"
    assert conv.overloads == ["aten::convolution"]
    assert conv.module == "conv" and conv.site["function"] == "forward"


def test_time_kinds_and_peak_memory(profiled_runs):
    profiles = _profiles(profiled_runs)
    neuron, cpu = profiles["neuron"], profiles["cpu"]
    assert neuron.time_kind == "host CPU time" and neuron.emulated and not neuron.synchronized
    assert cpu.time_kind == "wall time" and not cpu.emulated
    # the emulator's accounting: at least the conv activations were live at once
    assert neuron.peak_memory_bytes >= 2 * 4 * 14 * 14 * 4
    assert cpu.peak_memory_bytes is None  # the CPU keeps no allocator statistics
    assert neuron.steps == 1 and neuron.first_call is None and neuron.steady is None
    assert len(neuron.step_times_s) == 1 and neuron.step_times_s[0] > 0


def test_profile_round_trips_through_json(profiled_runs):
    profile = _profiles(profiled_runs)["neuron"]
    data = json.loads(json.dumps(profile.to_dict()))
    again = OpProfile.from_dict(data)
    assert again == profile
    assert data["time_kind"] == "host CPU time"
    assert data["total_time_s"] == sum(r["self_time_s"] for r in data["rows"])


def test_profile_diff_joins_both_runs_by_op(profiled_runs):
    profiles = _profiles(profiled_runs)
    df = profile_diff(profiles["cpu"], profiles["neuron"].to_dict(), EXPECTED_FALLBACKS)
    assert isinstance(df, pd.DataFrame) and list(df.columns) == DIFF_COLUMNS
    assert df["op"].is_unique
    by_op = df.set_index("op")
    for op, calls in EXPECTED_CALLS.items():
        row = by_op.loc[op]
        assert (row.ref_calls, row.target_calls) == (calls, calls)
        assert row.ref_time_s >= 0 and row.target_time_s >= 0
        if row.ref_time_s > 0:
            assert math.isclose(row.ratio, row.target_time_s / row.ref_time_s)
    assert set(df.loc[df["fallback"], "op"]) == set(EXPECTED_FALLBACKS)
    # an op only the emulated run has (moving parameters to the device) has no ratio
    only_target = df[(df["ref_calls"] == 0) & (df["target_calls"] > 0)]
    assert "aten::_to_copy" in set(only_target["op"]) and only_target["ratio"].isna().all()
    assert df.attrs["time_kind"] == {"ref": "wall time", "target": "host CPU time"}
    assert list(df["target_time_s"]) == sorted(df["target_time_s"], reverse=True)

    top = top_ops(df, 3, by="ref_calls")
    assert len(top) == 3 and list(top["ref_calls"]) == sorted(df["ref_calls"], reverse=True)[:3]
    assert top.attrs["time_kind"] == df.attrs["time_kind"]


def test_fallback_flags_from_rows_count_in_the_diff(profiled_runs):
    profiles = _profiles(profiled_runs)
    target = OpProfile.from_dict(profiles["neuron"].to_dict()).mark_fallbacks(["sort"])
    assert target.row("aten::sort").fallback is True
    assert target.row("aten::addmm").fallback is False
    df = profile_diff(profiles["cpu"], target)
    assert list(df.loc[df["fallback"], "op"]) == ["aten::sort"]


def test_chrome_trace_is_valid_trace_event_format(profiled_runs, tmp_path):
    profile = _profiles(profiled_runs)["neuron"]
    trace = json.loads(json.dumps(profile.to_chrome_trace()))
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert len(complete) + len(meta) == len(events)
    assert len(complete) == sum(row.calls for row in profile.rows)
    for event in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(event)
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0 and event["dur"] >= 0
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        assert event["args"]["time_kind"] == "host CPU time"
    names = {e["name"] for e in complete}
    assert set(EXPECTED_CALLS) <= names
    # the emulated device's backward ran on the thread that called it (the run's main thread)
    thread_names = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    backward_tids = {e["tid"] for e in complete if e["name"] == "aten::convolution_backward"}
    assert thread_names == {1: "main"} and backward_tids == {1}
    process = next(e for e in meta if e["name"] == "process_name")
    assert "host CPU time" in process["args"]["name"] and "emulated" in process["args"]["name"]

    both = combined_chrome_trace(_profiles(profiled_runs)["cpu"], profile.to_dict())
    assert {e["pid"] for e in both["traceEvents"]} == {1, 2}
    path = write_chrome_trace(tmp_path / "run.json", profile)
    assert json.loads(open(path).read())["traceEvents"] == trace["traceEvents"]


def test_repeated_runs_split_first_call_from_steady_state():
    backend = get_backend("neuron")
    weight = torch.randn(8, 8).to("neuron")
    with backend.activated(), op_profiler(backend) as recorder:
        for iteration in range(3):
            if iteration:
                recorder.next_step()
            out = torch.mm(weight, weight).relu()
            if iteration == 0:
                out = torch.sort(out).values  # only in the first iteration
    profile = recorder.result()
    assert profile.steps == 3 and len(profile.step_times_s) == 3
    first = {row.op: row.calls for row in profile.first_call}
    steady = {row.op: row.calls for row in profile.steady}
    assert first == {"aten::mm": 1, "aten::relu": 1, "aten::sort": 1}
    assert steady == {"aten::mm": 2, "aten::relu": 2}
    assert profile.row("aten::mm").calls == 3
    # the diff uses steady state by default, the first call on request
    df = profile_diff(profile, profile)
    assert "aten::sort" not in set(df["op"])
    assert "aten::sort" in set(profile_diff(profile, profile, phase="first")["op"])
    steps = {e[4] for e in profile.trace["events"]}
    assert steps == {0, 1, 2}


def test_a_backend_whose_memory_statistics_fail_is_reported_not_hidden():
    from neuron_workbench.backends import get_backend
    from neuron_workbench.trace.profile import op_profiler
    from neuron_workbench.trace.profile_data import OpProfile

    class Failing(type(get_backend("cpu"))):
        def _memory_stats_impl(self):
            raise RuntimeError("allocator statistics are off")

    with op_profiler(Failing()) as recorder:
        torch.ones(3) + 1
    profile = recorder.result()
    assert profile.peak_memory_bytes is None
    assert profile.peak_memory_unavailable == (
        "peak memory unavailable: RuntimeError: allocator statistics are off"
    )
    assert OpProfile.from_dict(profile.to_dict()).peak_memory_unavailable == (
        profile.peak_memory_unavailable
    )


def test_ops_of_autograds_device_thread_are_a_second_named_thread_of_the_trace():
    # The emulated device runs backward on the calling thread unless the cell asks for autograd's
    # device threads (as a real accelerator uses): their ops are named as a thread of their own.
    from neuron_workbench.run import RunSpec, compile_cell, execute

    cell = (
        "x = torch.ones(4, device='cuda', requires_grad=True)\n"
        "y = x.sin().sum()\n"
        "with torch.autograd.set_multithreading_enabled(True):\n"
        "    y.backward()\n"
        "g = x.grad\n"
    )
    spec = RunSpec(compile_cell(cell), {"torch": torch}, instruments={"profile": op_profiler})
    run = execute(spec, get_backend("neuron"))
    assert run.ok, run.error
    trace = run.extras["profile"].to_chrome_trace()
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    tids = {e["name"]: e["tid"] for e in events if e["ph"] == "X"}
    assert names[1] == "main" and tids["aten::sin"] == 1
    assert tids["aten::cos"] == 2 and names[2] == "thread 2 (autograd / other)"
