"""The noise floor and the error ratio, on the real reference path (cpu standing in for cuda)."""

import math

import pytest
import torch
from oracle_cells import TRAINING, spec_of

from neuron_workbench.backends import get_backend
from neuron_workbench.compare import compare_outputs
from neuron_workbench.compare.budget import (
    BUDGET_CLASSES,
    ORACLE,
    RANDOM_ROUNDING,
    Budget,
    OracleRuns,
    classify,
    measure_budget,
    tolerance_lines,
)
from neuron_workbench.run import execute


def test_the_floor_and_r_of_an_exact_copy_of_the_reference():
    spec = spec_of("x = torch.randn(64, 64)\ny = torch.softmax(x @ x, dim=-1)\nn = 3")
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    budget = measure_budget(spec, cpu, ref, ref)
    assert [o.path for o in budget.outputs] == ["x", "y"]  # floating outputs only
    y = budget.get("y")
    assert y.source == ORACLE and y.floor > 0 and y.error == y.floor
    assert y.ratio == 1.0 and y.label == "as accurate as the reference" and y.within
    # x is exactly the oracle's value: no run can be closer, so R is 1; its floor is one ulp of
    # float32 per element (no stored result is promised closer)
    x = budget.get("x")
    assert x.error == 0.0 and x.ratio == 1.0
    ulp = torch.nextafter(ref.outputs["x"].abs(), torch.tensor(math.inf)) - ref.outputs["x"].abs()
    assert x.floor == pytest.approx(float(torch.linalg.vector_norm(ulp.double())))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_a_one_ulp_difference_from_an_exact_reference_is_within_budget(dtype):
    # the reference is exact (3 * 0.5 and 0.1 + 0 are what float64 computes, rounded once); the
    # target is one ulp away from it: without a floor at the dtype's rounding R would explode
    source = (
        f"x = torch.tensor([0.1, 1.5, -7.0, 1e-3, 3.0], dtype=torch.{dtype})\n"
        "y = x * 0.5\n"
        "loss = (x * x).sum()"
    )
    one_ulp = source + "\ny = torch.nextafter(y, torch.full_like(y, 10.0))\n"
    one_ulp += "loss = torch.nextafter(loss, loss - 1)"
    cpu = get_backend("cpu")
    ref = execute(spec_of(source), cpu)
    target = execute(spec_of(one_ulp), cpu)
    assert not torch.equal(ref.outputs["y"], target.outputs["y"])
    budget = measure_budget(spec_of(source), cpu, ref, target, ["y", "loss"])
    for path in ("y", "loss"):
        measured = budget.get(path)
        assert measured.source == ORACLE and measured.error > 0, measured
        assert measured.ratio <= 2.0 and measured.within, measured
    # two ulps of every element is beyond what rounding explains once the reference is exact
    two_ulps = one_ulp + "\ny = torch.nextafter(y, torch.full_like(y, 10.0))\n"
    two_ulps += "y = torch.nextafter(y, torch.full_like(y, 10.0))"
    worse = execute(spec_of(two_ulps), cpu)
    assert measure_budget(spec_of(source), cpu, ref, worse, ["y"]).get("y").ratio > 2.0


def test_a_target_only_difference_gives_a_large_r():
    spec = spec_of("x = torch.randn(32, 32)\ny = torch.softmax(x, dim=-1)")
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    bad = execute(spec_of("x = torch.randn(32, 32)\ny = torch.softmax(x, dim=0)"), cpu)
    budget = measure_budget(spec, cpu, ref, bad, ["y"])
    (y,) = budget.outputs
    assert y.ratio > 1e3 and not y.within and y.label == "less accurate"
    assert y.describe().startswith("y: target ") and "x less accurate" in y.describe()


def test_an_output_computed_outside_torch_falls_back_to_random_rounding():
    numpy = pytest.importorskip("numpy")
    namespace = {"torch": torch, "np": numpy}
    source = (
        "x = torch.randn(16, 16)\n"
        "y = torch.from_numpy((x.numpy().astype(np.float32) @ x.numpy().astype(np.float32)))\n"
        "z = (x @ x).sum(dim=0)"
    )
    spec = spec_of(source, namespace)
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    runs = OracleRuns()
    budget = measure_budget(spec, cpu, ref, ref, oracle=runs)
    z, y = budget.get("z"), budget.get("y")
    assert z.source == ORACLE
    # NumPy computed y in float32 even in the oracle run: its floor comes from random rounding
    assert y.source == RANDOM_ROUNDING and "not promoted" in y.note
    assert y.floor > 0 and y.error == 0.0 and y.ratio == 0.0
    assert len(runs.rounding) == 3 and all(run.ok for run in runs.rounding)


def test_a_cell_the_oracle_cannot_run_is_said_so():
    source = "x = torch.randn(8)\nassert x.dtype == torch.float32\ny = x * 3"
    spec = spec_of(source)
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    budget = measure_budget(spec, cpu, ref, ref)
    assert budget.oracle_error.startswith("the float64 oracle run raised AssertionError")
    assert {o.source for o in budget.outputs} == {RANDOM_ROUNDING}


def test_classes_are_data_and_r_is_classed_by_them():
    assert [c.limit for c in BUDGET_CLASSES[:2]] == [1.2, 2.0]
    assert classify(1.2).label == "as accurate as the reference"
    assert classify(1.5).label == "marginal" and classify(1.5).within
    assert not classify(2.01).within and not classify(math.inf).within


def test_budget_round_trips_through_its_dict():
    spec = spec_of("x = torch.randn(8, 8)\ny = x @ x")
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    budget = measure_budget(spec, cpu, ref, ref)
    again = Budget.from_dict(budget.to_dict())
    assert again.outputs == budget.outputs


def test_tolerance_lines_pass_the_failing_output_they_name():
    ref = {"y": torch.linspace(1, 2, 50)}
    target = {"y": ref["y"] * (1 + 3e-5)}
    comparison = compare_outputs(ref, target)
    (line,) = tolerance_lines(comparison.failures)
    assert line.startswith("--tol 'y=")
    from neuron_workbench.compare.tolerances import TolerancePolicy, parse_override

    override = parse_override(line.removeprefix("--tol ").strip("'"))
    assert compare_outputs(ref, target, policy=TolerancePolicy(per_output=(override,))).passed


def test_a_nan_only_the_target_has_is_beyond_any_budget():
    spec = spec_of("x = torch.randn(16)\ny = x.exp()")
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    nan = execute(spec_of("x = torch.randn(16)\ny = x.exp()\ny[3] = float('nan')"), cpu)
    (y,) = measure_budget(spec, cpu, ref, nan, ["y"]).outputs
    assert y.ratio == math.inf and not y.within and y.factor == "inf"


def test_random_rounding_reruns_a_training_loop_faithfully():
    # the dtype assertion stops the oracle: every floor comes from random rounding
    source = "assert torch.ones(1).dtype == torch.float32\n" + TRAINING.replace(
        "opt.zero_grad()", "opt.zero_grad(set_to_none=False)"
    )
    spec = spec_of(source)
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    runs = OracleRuns()
    budget = measure_budget(spec, cpu, ref, ref, oracle=runs)
    assert budget.oracle_error and all(run.ok for run in runs.rounding)
    weight = budget.get("model.0.weight")
    assert weight.source == RANDOM_ROUNDING and weight.ratio == 0.0
    # rounding noise only: zero_grad and the optimizer saw the real gradients
    scale = float(ref.outputs["model"][0].weight.detach().norm())
    assert 0 < weight.floor < 1e-5 * scale
    assert 0 < budget.get("loss").floor < 1e-5
