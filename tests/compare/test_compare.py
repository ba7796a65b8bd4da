import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_workbench.compare import compare_outputs, default_tolerance
from neuron_workbench.errors import WorkbenchUsageError


def one(ref, target, **kw):
    comparison = compare_outputs({"v": ref}, {"v": target}, **kw)
    assert len(comparison.diffs) == 1
    return comparison.diffs[0]


def test_equal_tensors_match():
    d = one(torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(2, 3))
    assert d.status == "match" and d.max_abs == 0 and d.numel == 6


def test_difference_reports_worst_element_and_allowed_error():
    ref = torch.zeros(2, 3)
    target = ref.clone()
    target[1, 2] = 1e-3
    d = one(ref, target)
    assert d.status == "differ" and d.mismatched == 1
    assert d.worst_index == (1, 2)
    assert d.worst_target == pytest.approx(1e-3)
    assert d.allowed_at_worst == pytest.approx(1e-5)
    assert d.headline() == "v max|Δ| 1.0e-03 > 1.0e-05"


def test_shape_dtype_missing_and_nan_statuses():
    assert one(torch.zeros(2), torch.zeros(3)).status == "shape"
    assert one(torch.zeros(2), torch.zeros(2, dtype=torch.float64)).status == "dtype"
    assert one(torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan])).status == "match"
    assert (
        one(torch.tensor([1.0, math.nan]), torch.tensor([math.nan, 1.0])).status == "nan-mismatch"
    )
    comparison = compare_outputs({"a": 1}, {"b": 1})
    assert [d.status for d in comparison.diffs] == ["missing", "missing"]


def test_integers_compare_exactly():
    assert one(torch.tensor([2**31]), torch.tensor([2**31])).status == "match"
    assert one(torch.tensor([2**31]), torch.tensor([-(2**31)])).status == "differ"


def test_structures_give_readable_paths():
    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        extras: dict

    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    outputs = {
        "out": Out(torch.ones(2), {"tokens": [torch.zeros(1), "text"]}),
        "model": model,
        "arr": np.arange(3),
        "n": 3,
        "loss": 0.25,
    }
    paths = [d.path for d in compare_outputs(outputs, outputs).diffs]
    assert paths == [
        "out.logits",
        "out.extras['tokens'][0]",
        "out.extras['tokens'][1]",
        "model.weight",
        "model.weight.grad",
        "model.bias",
        "model.bias.grad",
        "arr",
        "n",
        "loss",
    ]


def test_strings_and_python_floats():
    assert one("a", "a").status == "match"
    assert one("a", "b").status == "differ"
    assert one(1.0, 1.0 + 1e-7).status == "match"  # float32 tolerance for Python floats
    assert one(1.0, 1.001).status == "differ"


def test_tolerances_both_or_neither():
    with pytest.raises(WorkbenchUsageError):
        compare_outputs({}, {}, rtol=0.1)
    d = one(torch.zeros(1), torch.full((1,), 0.05), rtol=0.0, atol=0.1)
    assert d.status == "match" and (d.tolerance.rtol, d.tolerance.atol) == (0.0, 0.1)


def test_default_tolerance_takes_the_loosest_dtype():
    tol = default_tolerance(torch.float32, torch.bfloat16)
    assert (tol.rtol, tol.atol) == (1.6e-2, 1e-5)
    assert default_tolerance(torch.int64).rtol == 0


floats = st.floats(allow_nan=True, allow_infinity=True, width=32)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(floats, min_size=1, max_size=12),
    st.lists(floats, min_size=1, max_size=12),
    st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
)
def test_pass_fail_agrees_with_assert_close(a, b, dtype):
    n = min(len(a), len(b))
    ref = torch.tensor(a[:n], dtype=torch.float32).to(dtype)
    target = torch.tensor(b[:n], dtype=torch.float32).to(dtype)
    try:
        torch.testing.assert_close(target, ref, equal_nan=True)
        expected = True
    except AssertionError:
        expected = False
    assert one(ref, target).passed == expected
