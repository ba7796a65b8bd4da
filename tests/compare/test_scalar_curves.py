"""Two runs' observed scalars aligned by call site and occurrence, on traces real runs recorded."""

import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.compare.scalars import compare_scalars
from neuron_workbench.compare.tolerances import TolerancePolicy
from neuron_workbench.run import RunSpec, compile_cell, execute
from neuron_workbench.run.records import recorded
from neuron_workbench.run.scalars import scalar_instrument

# Both "runs" are the same cell, compiled under one name (so their call sites align), with a
# drift the reference does not have: what a target's numerics would do from step `start` on.
CELL = (
    "losses = []\n"
    "for i in range(6):\n"
    "    loss = torch.tensor(2.0 - 0.1 * i + (drift if i >= start else 0.0), dtype=dtype)\n"
    "    losses.append(loss.item())\n"
    "    hits = int(torch.tensor(i + (extra if i >= start else 0)))\n"
)


def _trace(drift=0.0, start=99, dtype=torch.float32, extra=0, steps=6):
    program = compile_cell(CELL.replace("range(6)", f"range({steps})"), filename="<cell>")
    ns = {"torch": torch, "drift": drift, "start": start, "dtype": dtype, "extra": extra}
    spec = RunSpec(program, ns, instruments={"scalars": scalar_instrument()})
    run = execute(spec, get_backend("cpu"))
    assert run.ok, run.error
    return recorded(run.extras["scalars"])


def test_identical_runs_match_site_by_site():
    result = compare_scalars(_trace(), _trace())
    assert [(s.site, s.matched, len(s.ref)) for s in result.sites] == [
        ("<cell>:4", True, 6),
        ("<cell>:5", True, 6),
    ]
    assert result.first is None and not result.parted
    assert result.summary() == "2 scalar sites match"


def test_the_first_divergence_is_the_earliest_in_the_run():
    # float32 tolerance at |2| is 1e-5 + 1.3e-6 * 2: a 1e-3 drift from step 3 on is beyond it,
    # and the int site parts one step later
    result = compare_scalars(_trace(), _trace(drift=1e-3, start=3, extra=0))
    loss = result.sites[0]
    assert loss.parts_at == 4 and loss.abs_diff[3] > 9e-4 and loss.abs_diff[:3] == [0.0] * 3
    assert result.first.headline().startswith("<cell>:4 #4: 1.7 vs 1.701")
    ints = compare_scalars(_trace(), _trace(start=2, extra=1))
    assert (ints.first.site, ints.first.occurrence, ints.first.ref, ints.first.target) == (
        "<cell>:5",
        3,
        2,
        3,
    )


def test_tolerance_follows_the_dtype_and_the_users_tolerance():
    small = 1e-6  # within float32's tolerance, beyond float64's
    assert not compare_scalars(_trace(), _trace(drift=small, start=0)).parted
    f64 = compare_scalars(
        _trace(dtype=torch.float64), _trace(dtype=torch.float64, drift=small, start=0)
    )
    assert f64.parted and f64.sites[0].dtype == "float64"
    loose = TolerancePolicy(rtol=1e-2, atol=1e-2)
    assert not compare_scalars(_trace(), _trace(drift=1e-3, start=0), loose).parted


def test_a_run_that_logs_fewer_steps_parts_where_it_stops():
    result = compare_scalars(_trace(), _trace(steps=4))
    assert result.first.site == "<cell>:4" and result.first.occurrence == 5
    assert result.first.target is None
    assert (result.sites[0].ref_count, result.sites[0].target_count) == (6, 4)


def test_json_traces_compare_as_live_ones():
    live = compare_scalars(_trace(), _trace(drift=1e-3, start=1))
    from_json = compare_scalars(_trace().to_dict(), _trace(drift=1e-3, start=1).to_dict())
    assert from_json.to_dict() == live.to_dict()
    assert compare_scalars(None, _trace()) is None


def test_a_damaged_trace_says_why_and_a_report_of_it_warns():
    # a recording whose scalars were damaged (values edited to text) was compared without them
    # and without a word: PASS, the target's logged losses ignored
    from neuron_workbench.cell.pipeline import build_report
    from neuron_workbench.cell.settings import CompareOptions
    from neuron_workbench.compare.scalars import unreadable_trace
    from neuron_workbench.run.records import Run

    good = _trace().to_dict()
    damaged = {**good, "series": [{**good["series"][0], "values": ["a", "b"]}]}
    assert unreadable_trace(good) is None and unreadable_trace(None) is None
    assert unreadable_trace(damaged).startswith("ValueError: ")
    info = get_backend("cpu").info()
    ref = Run(backend=info, outputs={"x": torch.ones(2)}, extras={"scalars": damaged})
    target = Run(backend=info, outputs={"x": torch.ones(2)}, extras={"scalars": good})
    report = build_report(ref, target, CompareOptions(), cell_source="x = 1")
    assert report.scalars is None
    assert report.warnings == [
        f"the reference run's observed scalars could not be read ({unreadable_trace(damaged)}); "
        "they are not compared"
    ]


def test_a_divergence_shows_the_values_to_the_digit_where_they_differ():
    from neuron_workbench.compare.scalars import ScalarDivergence

    parted = ScalarDivergence("train.py:14", 2, 15.489961432543197, 15.489959716796875)
    assert parted.headline() == "train.py:14 #2: 15.489961 vs 15.489960"
    assert (
        ScalarDivergence("a.py:1", 1, 2.30125, 2.30561).headline()
        == "a.py:1 #1: 2.30125 vs 2.30561"
    )
    assert ScalarDivergence("a.py:1", 1, None, 1.5).headline() == "a.py:1 #1: none vs 1.5"
