"""Measurements leave the numeric comparison; scalars from tensors are compared in their dtype."""

from neuron_workbench.compare import compare_outputs
from neuron_workbench.run.measurements import Provenance, TaggedFloat, TaggedInt, TaggedStr

MS = Provenance("time", "time.perf_counter", "ms")
PEAK = Provenance("memory", "torch.cuda.max_memory_allocated", "MiB")
NAME = Provenance("device", "torch.cuda.get_device_name")


def _item(value, dtype):
    return TaggedFloat(value, Provenance("tensor", "Tensor.item", dtype=dtype))


def test_measurements_are_listed_not_diffed():
    ref = {"ms": TaggedFloat(10.0, MS), "log": {"peak": TaggedFloat(0.5, PEAK)}, "y": 1.0}
    target = {"ms": TaggedFloat(55.0, MS), "log": {"peak": TaggedFloat(0.25, PEAK)}, "y": 1.0}
    comparison = compare_outputs(ref, target)
    assert [d.path for d in comparison.diffs] == ["y"] and comparison.passed
    records = [m.to_dict() for m in comparison.measurements]
    assert records == [
        {"path": "ms", "kind": "time", "source": "time.perf_counter", "unit": "ms", "ref": 10.0,
         "target": 55.0},
        {"path": "log['peak']", "kind": "memory", "source": "torch.cuda.max_memory_allocated",
         "unit": "MiB", "ref": 0.5, "target": 0.25},
    ]  # fmt: skip


def test_a_measurement_on_one_side_only_is_still_a_measurement():
    ref = {"name": TaggedStr("cpu", NAME), "n": TaggedInt(3, PEAK)}
    target = {"name": "neuron:0", "n": 3}
    comparison = compare_outputs(ref, target)
    assert comparison.diffs == [] and not comparison.compared
    assert [(m.path, m.ref, m.target) for m in comparison.measurements] == [
        ("name", "cpu", "neuron:0"),
        ("n", 3, 3),
    ]


def test_an_item_of_a_float32_tensor_is_compared_as_float32():
    ref = {"loss": _item(0.1234567, "float32")}
    target = {"loss": _item(0.1234577, "float32")}
    (diff,) = compare_outputs(ref, target).diffs
    assert (diff.kind, diff.ref_dtype, diff.target_dtype) == ("number", "float32", "float32")
    assert diff.passed
    # the same difference between float64 tensors' items is beyond float64's tolerance
    (diff,) = compare_outputs(
        {"loss": _item(0.1234567, "float64")}, {"loss": _item(0.1234577, "float64")}
    ).diffs
    assert diff.ref_dtype == "float64" and diff.status == "differ"


def test_sources_of_different_dtypes_are_judged_in_the_less_precise_one():
    (diff,) = compare_outputs(
        {"v": _item(1.0, "float32")}, {"v": _item(1.0 + 2**-9, "bfloat16")}
    ).diffs
    assert diff.ref_dtype == "bfloat16" and diff.passed


def test_a_plain_python_float_is_compared_as_before():
    (diff,) = compare_outputs({"v": 1.0}, {"v": 1.0}).diffs
    assert diff.ref_dtype == "float64" and diff.passed


def test_an_explicit_tolerance_applies_to_integer_tensors_as_assert_close_applies_it():
    import torch

    ref = torch.tensor([0, 100], dtype=torch.int32)
    target = torch.tensor([0, 101], dtype=torch.int32)
    (diff,) = compare_outputs({"v": ref}, {"v": target}, rtol=0.1, atol=0.0).diffs
    assert diff.passed  # |Δ| 1 <= 0.1 * 100 (found by the hypothesis test)
    (diff,) = compare_outputs({"v": ref}, {"v": target}).diffs
    assert diff.status == "differ"  # integers are exact by default
