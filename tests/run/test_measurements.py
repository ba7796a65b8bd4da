"""Numbers that remember where they came from (timers, memory statistics, tensors), run by run."""

import copy
import json
import math
import pickle
import time

import numpy as np
import pytest
import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.run.cuda_on_host import CudaOnHost
from neuron_workbench.run.measurements import (
    Provenance,
    TaggedFloat,
    TaggedInt,
    is_measurement,
    observe_scalars,
    provenance_of,
    source_dtype,
    tracked,
    untagged,
)
from neuron_workbench.run.remap import cuda_remapped_to

S = Provenance("time", "time.perf_counter", "s")
MS = Provenance("time", "torch.cuda.Event.elapsed_time", "ms")
BYTES = Provenance("memory", "torch.cuda.max_memory_allocated", "B")


@pytest.mark.parametrize(
    ("expression", "unit"),
    [
        ("(t1 - t0) * 1e3", "ms"),
        ("1000 * (t1 - t0)", "ms"),
        ("(t1 - t0) * 1e6", "us"),
        ("t1 - t0", "s"),
        ("(t1 - t0) / 4", "s"),  # per step
        ("4 / (t1 - t0)", None),  # a rate
        ("round((t1 - t0) * 1e3, 2)", "ms"),
        ("abs(t0 - t1)", "s"),
    ],
)
def test_timer_values_stay_measurements_through_arithmetic(expression, unit):
    with tracked(torch.cuda):
        timers = {"t0": time.perf_counter(), "t1": time.perf_counter()}
    value = eval(expression, {}, timers)
    assert is_measurement(value)
    assert provenance_of(value).unit == unit
    assert provenance_of(value).source == "time.perf_counter"


def test_memory_figures_scale_by_exact_factors_only():
    mem = TaggedInt(3 * 2**20, BYTES)
    assert provenance_of(mem / 2**20).unit == "MiB" and mem / 2**20 == 3.0
    assert provenance_of(mem // 1024).unit == "KiB"
    assert provenance_of(mem / 1e9).unit == "GB"
    assert provenance_of(mem * 2).unit == "B"
    assert provenance_of(mem / mem).unit is None
    # a plain float on the left of an int measurement is float's own operator: not tagged
    assert provenance_of(1.0 * mem) is None


def test_tagged_numbers_behave_as_plain_numbers():
    ms = TaggedFloat(12.5, MS)
    assert repr(ms) == "12.5" and str(ms) == "12.5" and f"{ms:.1f}" == "12.5"
    assert ms == 12.5 and hash(ms) == hash(12.5) and isinstance(ms, float)
    assert json.dumps({"ms": ms, "n": TaggedInt(3, BYTES)}) == '{"ms": 12.5, "n": 3}'
    assert torch.equal(torch.tensor(ms), torch.tensor(12.5))
    assert torch.equal(torch.ones(2) * ms, torch.full((2,), 12.5))
    assert type(ms * torch.ones(2)) is torch.Tensor  # tensors built from them are plain
    assert type(float(ms)) is float and type(int(TaggedInt(3, BYTES))) is int
    assert ms > 3 and type(ms > 3) is bool
    assert math.floor(ms) == 12 and provenance_of(math.floor(ms)) == MS


def test_tagged_numbers_travel_and_copy_with_their_provenance_and_pickle_plain():
    from neuron_workbench.run.transport import dumps, loads

    ms = TaggedFloat(12.5, MS)
    for copied in (loads(dumps([ms])), copy.deepcopy([ms])):
        assert type(copied[0]) is TaggedFloat and provenance_of(copied[0]) == MS
    # any other pickle (a checkpoint, pickle.dump) holds the number plain code holds: no module
    # of this package is needed to load it
    data = pickle.dumps([ms, TaggedInt(3, BYTES)])
    assert b"neuron_workbench" not in data
    assert [type(x) for x in pickle.loads(data)] == [float, int]
    # type(x)(value), as statistics converts, is a plain number
    assert type(TaggedFloat(2.5)) is float and type(TaggedInt(2)) is int


def test_tracked_puts_every_source_back():
    originals = (time.perf_counter, time.time_ns, torch.Tensor.item, torch.cuda.memory_allocated)
    with tracked(torch.cuda):
        assert is_measurement(time.time_ns())
        assert provenance_of(time.time_ns()).unit == "ns"
    after = (time.perf_counter, time.time_ns, torch.Tensor.item, torch.cuda.memory_allocated)
    assert after == originals
    assert "item" not in vars(torch.Tensor) and type(time.perf_counter()) is float
    assert type(torch.ones(()).item()) is float


def test_a_run_notes_the_texts_it_makes_of_its_measurements():
    ms, loss = TaggedFloat(12.5, MS), TaggedFloat(0.25, Provenance("tensor", "Tensor.item"))
    f"{ms:.1f}"  # outside a run: noted nowhere
    with tracked(torch.cuda) as forms:
        assert f"took {ms:.2f} ms, loss {loss:.3f}" == "took 12.50 ms, loss 0.250"
        assert str(ms * 2) == "25.0" and repr([TaggedInt(4096, BYTES)]) == "[4096]"
        assert f"{np.mean([ms, ms]):.1f}" == "12.5"  # a NumPy summary, tagged
        with tracked(torch.cuda) as inner:  # a run inside a run notes into its own
            f"{ms:.3f}"
        f"{TaggedInt(7, BYTES)}"  # one character: it would cover any 7 of another text
    assert forms.texts == {
        "12.50": ("time", "torch.cuda.Event.elapsed_time"),
        "25.0": ("time", "torch.cuda.Event.elapsed_time"),
        "4096": ("memory", "torch.cuda.max_memory_allocated"),
        "12.5": ("time", "torch.cuda.Event.elapsed_time"),
    }
    assert inner.texts == {"12.500": ("time", "torch.cuda.Event.elapsed_time")}
    assert type(f"{ms:.1f}") is str  # the text itself is a plain str


def test_a_run_notes_the_float_values_of_its_measurements():
    loss = Provenance("tensor", "Tensor.item")
    with tracked(torch.cuda) as forms:
        ms = TaggedFloat(12.5, MS)
        half = ms / 2
        TaggedFloat(0.25, loss)  # no measurement
        TaggedFloat(float("nan"), MS)  # no value to find again
        median = np.median([ms, TaggedFloat(3.5, MS)])
    assert float(median) == 8.0
    assert forms.values == {
        12.5: ("time", "torch.cuda.Event.elapsed_time"),
        half: ("time", "torch.cuda.Event.elapsed_time"),
        3.5: ("time", "torch.cuda.Event.elapsed_time"),
        8.0: ("time", "torch.cuda.Event.elapsed_time"),
    }


def test_datetime_clock_readings_are_measurements_and_pickle_plain():
    import datetime

    from neuron_workbench.run.measurements import (
        MeasuredDatetime,
        MeasuredTimedelta,
        timers_named_in,
    )

    start = MeasuredDatetime.now()
    assert is_measurement(start) and provenance_of(start).source == "datetime.now"
    assert repr(start).startswith("datetime.datetime(")
    elapsed = MeasuredDatetime.now() - start
    assert type(elapsed) is MeasuredTimedelta
    assert provenance_of(elapsed.total_seconds()).unit == "s"
    assert is_measurement(elapsed / datetime.timedelta(seconds=1))
    assert is_measurement(start - datetime.timedelta(hours=1))
    assert not is_measurement(MeasuredDatetime(2020, 1, 1))  # built from the cell's own numbers
    # any pickle but the workbench's own transport gets plain values (a checkpoint's time stamp)
    again = pickle.loads(pickle.dumps({"t": start, "dt": elapsed}))
    assert type(again["t"]) is datetime.datetime and again["t"] == start
    assert type(again["dt"]) is datetime.timedelta and again["dt"] == elapsed
    with tracked(torch.cuda) as forms:
        stamp = f"{start:%H:%M:%S.%f}"
        day = time.strftime("%Y-%m-%d %H:%M:%S")
        fixed = time.strftime("%Y", (2020, 1, 1, 0, 0, 0, 0, 1, -1))  # a time given: no reading
    assert stamp in forms.texts and day in forms.texts and fixed not in forms.texts
    # the notebook's own names for datetime read the measured clock during the run only
    namespace = {"datetime": datetime.datetime, "dt": datetime}
    with timers_named_in(namespace):
        assert namespace["datetime"] is MeasuredDatetime
        assert is_measurement(namespace["dt"].datetime.now())
        assert namespace["dt"].timedelta is datetime.timedelta
    assert namespace == {"datetime": datetime.datetime, "dt": datetime}


def test_summaries_of_measurements_are_measurements_of_the_same_type():
    import statistics

    from neuron_workbench.run.transport import dumps, loads

    times = [TaggedFloat(t, MS) for t in (1.0, 2.0, 4.0)]
    with tracked(torch.cuda):
        mean, p90, var = np.mean(times), np.percentile(times, 90), np.var(times)
        peak = np.max([TaggedInt(2**21, BYTES), TaggedInt(2**20, BYTES)]) / 2**20
        median = statistics.median(t for t in times)  # an iterator is read once, as before
        quartiles = statistics.quantiles(times, n=4)
        total = math.fsum(times)
        plain = np.mean([1.0, 2.0])
    assert isinstance(mean, np.float64) and provenance_of(mean).unit == "ms"
    assert provenance_of(mean * 1e3).unit == "us" and is_measurement(mean.round(1))
    assert is_measurement(p90) and provenance_of(var).unit is None  # milliseconds squared
    assert provenance_of(peak).unit == "MiB"
    assert type(median) is TaggedFloat and median == 2.0
    assert all(is_measurement(q) for q in quartiles) and is_measurement(total)
    assert type(plain) is np.float64 and not is_measurement(plain)
    assert type(loads(dumps([mean]))[0]) is type(mean) and loads(dumps([mean]))[0] == mean
    assert type(untagged([mean])[0]) is np.float64  # what the notebook gets is NumPy's own
    # outside a run the functions are NumPy's and statistics' again
    assert not is_measurement(np.mean(times)) and not is_measurement(statistics.mean(times))


def test_a_numpy_array_of_measurements_is_one_and_so_is_what_numpy_computes_from_it():
    import copy
    import pickle

    from neuron_workbench.run.transport import dumps, loads

    times = [TaggedFloat(t, S) for t in (0.001, 0.002, 0.004)]
    with tracked(torch.cuda):
        arr = np.array(times)
        ms = arr * 1e3
        fast = ms < 2.5
        from_tuple = np.asarray(tuple(times))
        plain = np.array([1.0, 2.0])
        summaries = {"median": np.median(ms), "p90": np.percentile(ms, 90)}
    assert is_measurement(arr) and provenance_of(arr).unit == "s"
    assert provenance_of(ms).unit == "ms" and is_measurement(fast) and is_measurement(from_tuple)
    assert provenance_of(fast).unit is None  # a comparison of times is no time
    # methods, elements, iteration and lists of it: measurements, in its unit where they keep it
    assert provenance_of(ms.mean()).unit == "ms" and provenance_of(ms.max()).unit == "ms"
    assert provenance_of(ms.var()).unit is None and isinstance(ms.mean(), np.float64)
    assert provenance_of(ms[0]).unit == "ms" and is_measurement(ms[1:])
    assert all(is_measurement(t) for t in ms) and all(is_measurement(t) for t in ms.tolist())
    assert provenance_of(np.diff(ms)).unit == "ms"  # a difference of times is a time
    assert all(is_measurement(v) for v in summaries.values())
    assert ms.tolist() == [1.0, 2.0, 4.0] and repr(ms) == repr(np.array([1.0, 2.0, 4.0]))
    assert not is_measurement(plain)
    # the workbench's transport keeps the provenance; any other pickle and the notebook get NumPy's
    back = loads(dumps([ms]))[0]
    assert provenance_of(back) == provenance_of(ms) and back.tolist() == ms.tolist()
    assert type(pickle.loads(pickle.dumps(ms))) is np.ndarray
    assert provenance_of(copy.deepcopy(ms)) == provenance_of(ms)
    assert type(untagged({"ms": ms})["ms"]) is np.ndarray
    # outside a run np.array is NumPy's again
    assert not is_measurement(np.array(times))


def test_scalars_from_tensors_carry_their_dtype_and_pass_one_interception_point():
    # the run's torch function mode hands each conversion to the hook
    seen = []
    with (
        cuda_remapped_to(get_backend("cpu"), host=CudaOnHost()),
        observe_scalars(lambda t, v, how: seen.append((how, v))),
    ):
        loss = torch.tensor(0.25, dtype=torch.float32).item()
        half = torch.tensor([1.5], dtype=torch.bfloat16).item()
        ints = torch.arange(2, dtype=torch.int32).tolist()
        big = torch.zeros(2000).tolist()
        as_float = float(torch.tensor(2.0))
        as_int = int(torch.tensor(3))
        flag = torch.tensor(True).item()
        running = 0.0
        running += loss
    assert source_dtype(loss) == torch.float32 and source_dtype(half) == torch.bfloat16
    assert [source_dtype(i) for i in ints] == [torch.int32, torch.int32]
    assert source_dtype(running / 2) == torch.float32  # arithmetic keeps the tensor's precision
    assert source_dtype(ints[0] / 2) is None  # an int tensor's value divided is no int32 any more
    assert source_dtype(big[0]) is None  # a data dump stays plain
    # Python makes float() and int() return exact types: observed, handed out plain
    assert type(as_float) is float and type(as_int) is int and flag is True
    assert [how for how, _ in seen] == [
        "Tensor.item",
        "Tensor.item",
        "Tensor.tolist",  # the 2000-element one is not a logged value: not seen
        "float",
        "int",
        "Tensor.item",
    ]
    assert not is_measurement(loss)


def test_torchs_own_conversions_stay_plain_and_unobserved():
    # Adam reads each parameter's step count with .item(): nobody's value, plain and fast
    seen = []
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)
    model(torch.ones(1, 3)).sum().backward()
    reads = []
    with (
        cuda_remapped_to(get_backend("cpu"), host=CudaOnHost()),
        observe_scalars(lambda t, v, how: seen.append(how)),
    ):
        import torch.optim.adam as adam_module

        original = adam_module._get_value
        try:
            adam_module._get_value = lambda x: reads.append(original(x)) or reads[-1]
            optimizer.step()
        finally:
            adam_module._get_value = original
        mine = model.weight.sum().item()
    assert reads and all(type(value) is float for value in reads)
    assert seen == ["Tensor.item"] and source_dtype(mine) == torch.float32


def test_the_cpu_reference_accounts_the_storages_of_its_run():
    host = CudaOnHost(account_memory=True)
    with cuda_remapped_to(get_backend("cpu"), host=host):
        torch.cuda.reset_peak_memory_stats()
        a = torch.ones(1024, device="cuda")  # 4 KiB
        b = torch.ones(2048, device="cuda")  # 8 KiB
        view = b[:10]
        current = torch.cuda.memory_allocated()
        del a
        after_free = torch.cuda.memory_allocated()
        peak = torch.cuda.max_memory_allocated()
        stats = torch.cuda.memory_stats()
    assert (current, after_free, peak) == (12288, 8192, 12288)
    assert is_measurement(peak) and provenance_of(peak).unit == "B"
    assert stats["allocated_bytes.all.peak"] == 12288 and view.numel() == 10


def test_without_accounting_the_cpu_reference_answers_zero():
    with cuda_remapped_to(get_backend("cpu"), host=CudaOnHost()):
        torch.ones(1024, device="cuda")
        assert torch.cuda.max_memory_allocated() == 0


def test_compiled_code_converts_scalars_as_without_the_hook(recwarn):
    def body(x):
        return x.sum().item() + float(x[0])

    compiled = torch.compile(body, backend="eager")
    with cuda_remapped_to(get_backend("cpu"), host=CudaOnHost()):
        value = compiled(torch.ones(3))
    assert value == 4.0
    assert not [w for w in recwarn if "does not know how to trace" in str(w.message)]
