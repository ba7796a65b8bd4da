import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_workbench.compare import compare_leaf, compare_outputs, default_tolerance
from neuron_workbench.compare.tolerances import Tolerance, TolerancePolicy
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


def test_numpy_dtypes_no_tensor_holds_are_compared():
    # longdouble (a float128 array from SciPy code) was an "error" output: torch holds no such dtype
    d = one(np.array([1.5, 2.0], dtype=np.longdouble), np.array([1.5, 2.5], dtype=np.longdouble))
    assert (d.status, d.ref_dtype, d.max_abs) == ("differ", "float64", 0.5), d.to_dict()
    assert one(np.clongdouble(1 + 2j), np.clongdouble(1 + 2j)).status == "match"
    assert one(np.array([b"a"]), np.array([b"b"])).status == "differ"


def test_complex32_and_quantized_outputs_that_differ_are_measured():
    # both were "error" outputs ("equal_cpu" not implemented for ComplexHalf; a quantized
    # isclose): a quantized one is compared by its dequantized values, as assert_close does
    x = torch.tensor([1.0, 2.0, 3.0])
    d = one(x.to(torch.complex32), (x + torch.tensor([0.0, 1.0, 0.0])).to(torch.complex32))
    assert (d.status, d.mismatched, d.max_abs) == ("differ", 1, 1.0), d.to_dict()
    q = torch.quantize_per_tensor(x, 0.5, 0, torch.qint8)
    d = one(q, torch.quantize_per_tensor(x + 0.5, 0.5, 0, torch.qint8))
    assert (d.status, d.mismatched, d.max_abs) == ("differ", 3, 0.5), d.to_dict()
    assert one(q, torch.quantize_per_tensor(x, 0.25, 0, torch.qint8)).status == "match"


def test_integers_compare_exactly():
    assert one(torch.tensor([2**31]), torch.tensor([2**31])).status == "match"
    assert one(torch.tensor([2**31]), torch.tensor([-(2**31)])).status == "differ"


def test_python_ints_of_any_size_compare_exactly():
    # `n = 10**400` is a valid output: no int64 tensor holds it (torch.tensor raised "Overflow when
    # unpacking long long", an error status), so such ints compare as Python ints, exactly
    big = 10**400
    assert one(big, big).status == "match" and one(2**64, 2**64).status == "match"
    assert one(-big, -big).status == "match"
    d = one(big, big + 1)
    assert (d.status, d.kind, d.ref_dtype, d.mismatched, d.max_abs) == (
        "differ", "number", "int", 1, 1.0
    )  # fmt: skip
    assert d.headline() == "v max|Δ| 1.0e+00 > 0.0e+00"
    # a difference too large for a float reads inf in the report's numbers, exact in its line
    d = one(big, 3)
    assert d.status == "differ" and d.headline() == "v max|Δ| 1.0e+400 > 0.0e+00"
    data = d.to_dict()
    assert (data["max_abs"], data["worst_ref"], data["worst_target"]) == ("inf", "inf", 3.0)
    assert one(-big, big).to_dict()["worst_ref"] == "-inf"
    json.dumps([one(a, b).to_dict() for a, b in [(big, 3), (big, big + 1)]], allow_nan=False)
    assert one(5, 2**63).status == "differ" and one(2**63 - 1, 2**63 - 1).ref_dtype == "int64"
    # --tol applies as it does to ints that fit in int64, with atol + rtol * |ref| exact
    loose = {"rtol": 1e-9, "atol": 0.0}
    assert one(big, big + 10**390, **loose).status == "match"
    d = one(big, big + 10**392, **loose)
    assert d.status == "differ" and d.headline() == "v max|Δ| 1.0e+392 > 1.0e+391"
    # against anything but an int it is a dtype difference, as an int64 against a float is
    d = one(big, 1e300)
    assert (d.status, d.detail) == ("dtype", "int beyond int64 vs float")
    assert one(True, big).status == "dtype"
    assert one(big, "1" + "0" * 400).status == "dtype"
    assert one(10**5000, 10**5000).status == "match"  # past str(int)'s 4300-digit limit too


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


def test_strings_naming_each_runs_device_match():
    # str(x.device), x.device.type: the cell's cuda as each run sees it
    cpu_ref = ("cpu", "neuron:0")
    assert compare_leaf("d", "cpu", "neuron:0", devices=cpu_ref).status == "match"
    assert compare_leaf("d", "cpu", "neuron", devices=cpu_ref).status == "match"
    gpu_ref = ("cuda:0", "tpu:0")
    assert compare_leaf("d", "cuda:0", "tpu:0", devices=gpu_ref).status == "match"
    assert compare_leaf("d", "cuda:1", "tpu:0", devices=gpu_ref).status == "differ"
    assert compare_leaf("d", "cuda", "neuron", devices=gpu_ref).status == "differ"
    assert compare_leaf("d", "cpu", "gpu", devices=cpu_ref).status == "differ"
    assert compare_leaf("d", "cpu", "neuron", devices=None).status == "differ"
    both = compare_outputs({"d": "cpu"}, {"d": "neuron"}, devices=cpu_ref)
    assert both.passed and "the runs' devices" in both.diffs[0].detail


CPU_REF = ("cpu", "neuron:0")


def test_texts_that_name_each_runs_device_inside_match():
    # f"on {y.device}": on a GPU both runs would write "on cuda:0"
    y = torch.ones(3)
    text = one(f"on {y.device} ({y.device.type})", "on neuron:0 (neuron)", devices=CPU_REF)
    assert text.status == "match" and "the runs' devices" in text.detail
    assert one("moved to cpu.", "moved to neuron.", devices=CPU_REF).status == "match"
    assert one("cpu:0 and cpu", "neuron:0 and neuron", devices=CPU_REF).status == "match"
    # a name the cell wrote itself is the same literal in both runs
    assert one(f"{y.device} vs cpu", "neuron:0 vs cpu", devices=CPU_REF).status == "match"
    gpu_ref = ("cuda:0", "tpu:0")
    assert one("ran on cuda:0", "ran on tpu:0", devices=gpu_ref).status == "match"
    assert one("ran on cuda", "ran on tpu:0", devices=gpu_ref).status == "match"


def test_reprs_the_host_writes_without_its_device_match_the_targets():
    # str() of a tensor on the device names it, of the host's own tensor not; a device's repr
    # names the device's index, the CPU's none
    ref = "tensor([[1., 2.]],\n       grad_fn=<MulBackward0>)"
    target = "tensor([[1., 2.]], device='neuron:0',\n       grad_fn=<MulBackward0>)"
    assert one(ref, target, devices=CPU_REF).status == "match"
    assert one("tensor(3)", "tensor(3, device='neuron:0')", devices=CPU_REF).status == "match"
    where = one("device(type='cpu')", "device(type='neuron', index=0)", devices=CPU_REF)
    assert where.status == "match" and "the runs' devices" in where.detail
    for ref, target, devices in [
        ("tensor(3)", "tensor(4, device='neuron:0')", CPU_REF),  # the values differ
        ("tensor(3)", "tensor(3, device='tpu:0')", CPU_REF),  # not the target's device
        ("tensor(3)", "tensor(3, device='neuron:0')", ("cuda:0", "neuron:0")),  # a GPU names it
        ("tensor(3)", "tensor(3, dtype=torch.int32, device='neuron:0')", CPU_REF),
    ]:
        assert one(ref, target, devices=devices).status == "differ", (ref, target)


def test_texts_that_differ_elsewhere_or_name_no_device_as_a_token_still_differ():
    for ref, target, devices in [
        ("on cpu!", "on neuron:0?", CPU_REF),  # differs past the name too
        ("on cpu", "at neuron:0", CPU_REF),
        ("cpu_time 3", "neuron:0_time 3", CPU_REF),  # not a whole token
        ("xcpu", "xneuron", CPU_REF),
        ("on neuron:0", "on cpu", CPU_REF),  # each run's own device only
        ("cpu and cpu", "neuron and tpu", CPU_REF),
        ("cpu time", "neuron:0 time", ("cuda:0", "neuron:0")),  # cpu is not this reference's
        ("ran on cuda:1", "ran on tpu:0", ("cuda:0", "tpu:0")),  # indices disagree
        ("on cpu", "on neuron:0 now", CPU_REF),
    ]:
        diff = one(ref, target, devices=devices)
        assert diff.status == "differ", (ref, target)
        assert diff.detail == f"{ref!r} != {target!r}"
    # the control: the same texts but for the names match
    assert one("on cpu!", "on neuron:0!", devices=CPU_REF).status == "match"
    assert one("cpu time", "cuda:0 time", devices=("cpu", "cuda:0")).status == "match"


def test_dict_keys_naming_each_runs_device_pair_into_one_output():
    y = torch.arange(3.0)
    ref = {"a": 1, "d": {str(y.device): y.sum(), "n": [y]}, "e": {y.device.type: [y, y * 2]}}
    target = {
        "a": 1,
        "d": {"neuron:0": y.sum(), "n": [y.clone()]},
        "e": {"neuron": [y.clone(), y * 3]},
    }
    comparison = compare_outputs(ref, target, devices=CPU_REF)
    # reported at the reference's paths, in the reference's order
    assert [(d.path, d.status) for d in comparison.diffs] == [
        ("a", "match"),
        ("d['cpu']", "match"),
        ("d['n'][0]", "match"),
        ("e['cpu'][0]", "match"),
        ("e['cpu'][1]", "differ"),
    ]
    by_path = {d.path: d for d in comparison.diffs}
    assert by_path["d['cpu']"].detail == "d['neuron:0'] on the target"
    assert by_path["e['cpu'][1]"].max_abs == pytest.approx(2.0)
    assert by_path["e['cpu'][1]"].detail.endswith("e['neuron'][1] on the target")
    # texts stored under such keys pair and match too
    texts = compare_outputs(
        {"d": {"cpu": "on cpu"}}, {"d": {"neuron:0": "on neuron:0"}}, devices=CPU_REF
    )
    assert texts.passed and [d.path for d in texts.diffs] == ["d['cpu']"]


def test_device_keys_of_each_runs_device_pair_into_one_output():
    # {x.device: ...}: the host's device on the reference, the target's in the kernel, which holds
    # it as privateuseone (it has no neuron device of its own)
    y = torch.arange(3.0)
    target_device = torch.device("privateuseone", 0)
    ref = {"d": {torch.device("cpu"): y.sum()}, "t": {torch.device("cpu"): y}}
    target = {"d": {target_device: y.sum()}, "t": {target_device: y * 2}}
    comparison = compare_outputs(ref, target, devices=CPU_REF)
    assert [(d.path, d.status) for d in comparison.diffs] == [
        ("d[device(type='cpu')]", "match"),
        ("t[device(type='cpu')]", "differ"),
    ]
    # a device key that names neither run's device stays itself
    other = compare_outputs(
        {"d": {torch.device("meta"): 1}}, {"d": {target_device: 1}}, devices=CPU_REF
    )
    assert [d.status for d in other.diffs] == ["missing", "missing"]


def test_keys_that_could_pair_several_ways_stay_missing():
    # str(y.device) and y.device.type are one key on the host ("cpu") and two on the target
    y = torch.ones(2)
    ref = {"d": {str(y.device): y, y.device.type: y}, "z": 0}
    target = {"d": {"neuron:0": y.clone(), "neuron": y.clone()}, "z": 0}
    comparison = compare_outputs(ref, target, devices=CPU_REF)
    assert [(d.path, d.status, d.detail) for d in comparison.diffs] == [
        ("d['cpu']", "missing", "missing on the target"),
        ("z", "match", ""),
        ("d['neuron:0']", "missing", "missing on the reference"),
        ("d['neuron']", "missing", "missing on the reference"),
    ]
    # two reference keys for one target key: neither is chosen
    two = compare_outputs(
        {"d": {"cpu": y, "cpu:0": y}}, {"d": {"neuron:0": y}}, devices=CPU_REF
    ).diffs
    assert [d.status for d in two] == ["missing"] * 3
    # the control: with only the one target key, the pairing is one-to-one
    del target["d"]["neuron"]
    one_key = compare_outputs(ref, target, devices=CPU_REF).diffs
    assert [(d.path, d.status) for d in one_key] == [("d['cpu']", "match"), ("z", "match")]


def test_without_devices_texts_and_keys_compare_as_they_are():
    y = torch.ones(2)
    ref = {"msg": f"on {y.device}", "d": {str(y.device): y}}
    target = {"msg": "on neuron:0", "d": {"neuron:0": y.clone()}}
    comparison = compare_outputs(ref, target)
    assert [(d.path, d.status) for d in comparison.diffs] == [
        ("msg", "differ"),
        ("d['cpu']", "missing"),
        ("d['neuron:0']", "missing"),
    ]
    assert comparison.diffs[0].detail == "'on cpu' != 'on neuron:0'"
    assert compare_outputs(ref, target, devices=CPU_REF).passed  # the same outputs, with devices


def test_texts_that_differ_only_in_each_runs_measured_texts_are_measurements():
    texts = (
        {"12.500": ("time", "time.perf_counter")},
        {"3.125": ("time", "time.perf_counter"), "0.25": ("memory", "torch.cuda.memory_allocated")},
    )
    ref = {"line": "took 12.500 ms", "other": "took 12.500 ms, loss 0.5", "same": "took 1 ms"}
    target = {"line": "took 3.125 ms", "other": "took 3.125 ms, loss 0.7", "same": "took 1 ms"}
    comparison = compare_outputs(ref, target, measured_texts=texts)
    (measured,) = comparison.measurements
    assert (measured.path, measured.kind, measured.ref, measured.target) == (
        "line",
        "time",
        "took 12.500 ms",
        "took 3.125 ms",
    )
    assert measured.source == "a text formatted from time.perf_counter"
    # the words around a measured text must agree; equal texts stay matches
    assert {d.path: d.status for d in comparison.diffs} == {"other": "differ", "same": "match"}
    # a text the target made of no measurement, or runs that noted none: a difference
    assert not compare_outputs(ref, target, measured_texts=(texts[0], {})).measurements
    assert not compare_outputs(ref, target).measurements


def test_numbers_holding_only_each_runs_measured_values_are_measurements():
    timer = ("time", "time.perf_counter")
    values = ({0.125: timer, 0.5: timer}, {0.375: timer, 0.75: timer})
    ref = {
        "p50": 0.125,
        "column": np.array([0.125, 0.5]),
        "as_float32": torch.tensor([0.125, 0.5]),
        "mixed": np.array([0.125, 2.0]),
        "loss": 0.5,
        "reversed": np.array([0.5, 0.125])[::-1],
    }
    target = {
        "p50": 0.375,
        "column": np.array([0.375, 0.75]),
        "as_float32": torch.tensor([0.375, 0.75]),
        "mixed": np.array([0.375, 3.0]),
        "loss": 0.625,
        "reversed": np.array([0.75, 0.375])[::-1],
    }
    comparison = compare_outputs(ref, target, measured_values=values)
    assert [m.path for m in comparison.measurements] == [
        "p50",
        "column",
        "as_float32",
        "reversed",
    ]
    assert comparison.measurements[0].source == "time.perf_counter"
    # a value neither run measured, on either side: a difference
    assert {d.path: d.status for d in comparison.diffs} == {"mixed": "differ", "loss": "differ"}
    assert not compare_outputs(ref, target, measured_values=(values[0], {})).measurements


def test_paths_on_names_each_run_drew_from_tempfile_match_in_draw_order():
    drawn = (["aaaa1111", "bbbb2222"], ["cccc3333", "dddd4444"])
    same = compare_leaf("p", "/tmp/aaaa1111/m.pt", "/tmp/cccc3333/m.pt", temp_names=drawn)
    assert same.status == "match" and "temporary names" in same.detail
    two = compare_leaf("p", "aaaa1111:bbbb2222", "cccc3333:dddd4444", temp_names=drawn)
    assert two.status == "match"
    # the reference's first folder against the target's second: not the same code's path
    swapped = compare_leaf("p", "/tmp/aaaa1111/m.pt", "/tmp/dddd4444/m.pt", temp_names=drawn)
    assert swapped.status == "differ"
    # around the names the strings must agree, and a name neither run drew is text
    assert compare_leaf("p", "/tmp/aaaa1111/a", "/tmp/cccc3333/b", temp_names=drawn).status == (
        "differ"
    )
    assert compare_leaf("p", "/tmp/zzzz9999", "/tmp/cccc3333", temp_names=drawn).status == (
        "differ"
    )
    assert compare_leaf("p", "/tmp/aaaa1111", "/tmp/cccc3333").status == "differ"


def test_tolerances_both_or_neither():
    with pytest.raises(WorkbenchUsageError):
        compare_outputs({}, {}, rtol=0.1)
    d = one(torch.zeros(1), torch.full((1,), 0.05), rtol=0.0, atol=0.1)
    assert d.status == "match" and (d.tolerance.rtol, d.tolerance.atol) == (0.0, 0.1)


def test_default_tolerance_takes_the_loosest_dtype():
    tol = default_tolerance(torch.float32, torch.bfloat16)
    assert (tol.rtol, tol.atol) == (1.6e-2, 1e-5)
    assert default_tolerance(torch.int64).rtol == 0


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.bool]
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-6, 65504.0, 3.0e38]),
)
tolerances = st.one_of(
    st.none(),
    st.tuples(st.sampled_from([0.0, 1e-6, 1e-3, 0.1]), st.sampled_from([0.0, 1e-8, 1e-5, 0.5])),
)


@st.composite
def tensor_pairs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from([(), (1,), (7,), (3, 4), (2, 1, 5)]))
    n = 1
    for size in shape:
        n *= size
    a = draw(st.lists(values, min_size=n, max_size=n))
    # the target is the reference perturbed element-wise, sometimes a lot, sometimes not at all
    noise = draw(
        st.lists(
            st.sampled_from([0.0, 0.0, 1e-7, 1e-4, 1e-2, 1.0, float("nan")]), min_size=n, max_size=n
        )
    )
    ref = torch.tensor(a, dtype=torch.float64).reshape(shape)
    target = ref * (1 + torch.tensor(noise, dtype=torch.float64).reshape(shape))
    if dtype.is_floating_point:
        return ref.to(dtype), target.to(dtype)
    lim = 1000
    return (
        ref.nan_to_num(0).clamp(-lim, lim).to(dtype),
        target.nan_to_num(0).clamp(-lim, lim).to(dtype),
    )


def _assert_close_passes(target, ref, **tol):
    try:
        torch.testing.assert_close(target, ref, equal_nan=True, **tol)
        return True
    except AssertionError:
        return False


@settings(max_examples=1000, deadline=None)
@given(tensor_pairs(), tolerances)
def test_pass_fail_agrees_with_assert_close_and_tight_tolerances_pass(pair, tol):
    ref, target = pair
    kw = {} if tol is None else {"rtol": tol[0], "atol": tol[1]}
    d = one(ref, target, **kw)
    assert d.passed == _assert_close_passes(target, ref, **kw)
    if d.tight_atol is not None:
        assert _assert_close_passes(target, ref, rtol=d.tolerance.rtol, atol=d.tight_atol)
    if d.tight_rtol is not None:
        assert _assert_close_passes(target, ref, rtol=d.tight_rtol, atol=d.tolerance.atol)


def test_metrics_of_a_known_difference():
    ref = torch.tensor([1.0, 2.0, 3.0, 4.0])
    target = torch.tensor([1.0, 2.0, 3.0, 4.4])
    d = one(ref, target)
    assert d.status == "differ" and d.mismatched == 1 and d.mismatch_pct == 25.0
    assert d.max_abs == pytest.approx(0.4, rel=1e-5)
    assert d.mean_abs == pytest.approx(0.1, rel=1e-5)
    assert d.max_rel == pytest.approx(0.1, rel=1e-5)
    assert d.rmse == pytest.approx(0.2, rel=1e-5)
    expected_cos = float(ref @ target / (ref.norm() * target.norm()))
    assert d.cosine == pytest.approx(expected_cos, rel=1e-6)
    assert d.snr_db == pytest.approx(10 * math.log10(30 / 0.16), rel=1e-5)
    assert d.worst_index == (3,) and d.worst_target == pytest.approx(4.4)
    # rtol stays 1.3e-6: atol must cover 0.4 - 1.3e-6 * 4
    assert d.tight_atol == pytest.approx(0.4 - 1.3e-6 * 4, rel=1e-4)


def test_chunked_reduction_matches_a_single_chunk():
    from neuron_workbench.compare.metrics import tensor_stats
    from neuron_workbench.compare.tolerances import Tolerance

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(10_000, generator=g)
    target = ref + 1e-4 * torch.randn(10_000, generator=g)
    target[1234] = float("nan")
    tol = Tolerance(1e-4, 1e-5)
    whole = tensor_stats(ref, target, tol, chunk_elements=1 << 20)
    chunked = tensor_stats(ref, target, tol, chunk_elements=777)
    for field in ("mismatched", "nan_mismatches", "worst_index"):
        assert getattr(whole, field) == getattr(chunked, field)
    for field in ("max_abs", "mean_abs", "max_rel", "rmse", "cosine", "snr_db"):
        assert getattr(whole, field) == pytest.approx(getattr(chunked, field), rel=1e-6)


def test_presets_and_per_output_overrides():
    from neuron_workbench.compare.tolerances import Tolerance, TolerancePolicy, parse_override

    ref = {"logits": torch.zeros(3), "model": {"w": torch.zeros(2), "b": torch.zeros(2)}}
    target = {
        "logits": torch.full((3,), 5e-5),
        "model": {"w": torch.full((2,), 5e-5), "b": torch.full((2,), 5e-5)},
    }
    assert not compare_outputs(ref, target).passed  # 5e-5 > atol 1e-5
    policy = TolerancePolicy(
        preset="strict",
        per_output=(parse_override("logits=0,1e-4"), ("model['w']", Tolerance(0, 1e-4))),
    )
    comparison = compare_outputs(ref, target, policy=policy)
    assert {d.path: d.status for d in comparison.diffs} == {
        "logits": "match",
        "model['w']": "match",
        "model['b']": "differ",
    }
    assert comparison.diffs[2].tolerance == Tolerance(0.0, 0.0)  # the strict preset
    glob = TolerancePolicy(per_output=(("model*", Tolerance(0, 1e-3)),))
    assert compare_outputs(ref, target, policy=glob).failures[0].path == "logits"
    with pytest.raises(WorkbenchUsageError):
        TolerancePolicy(preset="loose")
    with pytest.raises(WorkbenchUsageError):
        parse_override("logits=1e-3")


def test_meta_tensors_compare_by_shape_and_dtype():
    meta = torch.empty(3, 2, device="meta")
    assert one(meta, torch.empty(3, 2, device="meta")).status == "match"
    assert one(meta, torch.empty(2, 3, device="meta")).status == "shape"
    d = one(meta, torch.zeros(3, 2))
    assert d.status == "differ" and "reference holds a meta tensor" in d.detail


def test_sparse_tensors_compare_by_their_dense_values():
    a = torch.eye(3).to_sparse()
    assert one(a, torch.eye(3).to_sparse()).status == "match"
    d = one(a, (torch.eye(3) * 2).to_sparse())
    assert d.status == "differ" and d.max_abs == 1.0
    d = one(a, torch.eye(3))
    assert d.status == "differ" and "layout" in d.detail


def test_a_leaf_that_cannot_be_compared_is_an_error_of_one_line(monkeypatch):
    # torch's dispatcher errors run to dozens of lines (the list of backends): the report's line
    # takes the first
    def equal(a, b):
        raise NotImplementedError("Could not run 'aten::equal'\nCPU: registered\nMeta: ...")

    monkeypatch.setattr(torch, "equal", equal)
    d = one(torch.ones(2), torch.ones(2))
    assert d.status == "error"
    assert d.detail == "NotImplementedError: Could not run 'aten::equal'"


def test_the_tight_rtol_of_integers_passes_where_isclose_rounds_in_float32():
    # 1/164 * 164 is 0.99999994 in float32: the exact rtol of a difference of 1 did not pass
    ref = torch.tensor([0, 164], dtype=torch.int32)
    target = torch.tensor([0, 165], dtype=torch.int32)
    d = one(ref, target)
    assert _assert_close_passes(target, ref, rtol=d.tight_rtol, atol=0.0)


def test_large_integers_that_differ_read_their_exact_difference():
    # int32 values above 2**24 round in float32: 16777217 vs 16777218 read max |Δ| 2, and
    # 16777217 vs 16777216 (both rounding to 2**24) a "differ" with max |Δ| 0
    for dtype in (torch.int32, torch.int64, torch.uint32):
        d = one(
            torch.tensor([2**24 + 1, 5], dtype=dtype), torch.tensor([2**24 + 2, 5], dtype=dtype)
        )
        assert (d.status, d.max_abs, d.worst_ref, d.worst_target) == (
            "differ",
            1.0,
            2**24 + 1,
            2**24 + 2,
        )
        d = one(torch.tensor([2**24 + 1], dtype=dtype), torch.tensor([2**24], dtype=dtype))
        assert (d.status, d.max_abs) == ("differ", 1.0)


def _fields(diff):
    return [(f.name, repr(getattr(diff, f.name))) for f in dataclasses.fields(diff)]


def test_parameters_compare_as_their_detached_values():
    # The common leaf is compared without a detach: nothing may differ from its detached values.
    torch.manual_seed(0)
    ref = torch.nn.Parameter(torch.randn(4, 3))
    for target in (ref.detach().clone(), ref.detach() + 1e-3, ref.detach().to_sparse()):
        target = torch.nn.Parameter(target, requires_grad=not target.is_sparse)
        got = compare_leaf("w", ref, target)
        assert _fields(got) == _fields(compare_leaf("w", ref.detach(), target.detach()))
    assert ref.grad is None and ref.grad_fn is None


def test_tensor_outputs_take_the_same_way_as_any_other_leaf():
    # compare_outputs sends a pair of tensors straight to their comparison (no measurement or
    # missing output to look for): the same OutputDiff as compare_leaf's, under any policy.
    ref = {"a": torch.ones(3), "b": torch.zeros(2, dtype=torch.float64), "c": torch.ones(1)}
    target = {"a": torch.ones(3) + 1e-6, "b": torch.zeros(3, dtype=torch.float64), "c": 1.0}
    for policy in (
        TolerancePolicy(),
        TolerancePolicy(preset="strict"),
        TolerancePolicy(per_output=(("a", Tolerance(0.0, 0.0)),)),
    ):
        diffs = compare_outputs(ref, target, policy=policy).diffs
        expected = [compare_leaf(p, ref[p], target[p], policy) for p in ref]
        assert [_fields(d) for d in diffs] == [_fields(d) for d in expected]


def test_an_outputs_dict_keeps_its_keys_in_order_and_non_finite_numbers_as_text():
    from neuron_workbench.compare.compare import OutputDiff

    diff = OutputDiff("w", "differ", "tensor", Tolerance(1e-6, 1e-5), ref_shape=(2,))
    diff.max_abs, diff.snr_db, diff.cosine, diff.worst_index = math.inf, -math.inf, math.nan, (1,)
    data = diff.to_dict()
    assert list(data) == [
        "path", "status", "kind", "rtol", "atol", "ref_dtype", "target_dtype", "ref_shape",
        "target_shape", "numel", "mismatched", "mismatch_pct", "nan_mismatches", "inf_mismatches",
        "max_abs", "mean_abs", "max_rel", "rmse", "cosine", "snr_db", "worst_ref", "worst_target",
        "allowed_at_worst", "tight_rtol", "tight_atol", "worst_index", "detail", "hints",
    ]  # fmt: skip
    assert (data["max_abs"], data["snr_db"], data["cosine"]) == ("inf", "-inf", "nan")
    assert data["ref_shape"] == [2] and data["worst_index"] == [1]
    diff.explained = "its gradients matched"
    assert list(diff.to_dict())[-1] == "explained"


def test_a_value_where_the_other_run_left_none_is_missing_on_that_side():
    # None inside a structure is no output; where one run computed a value there, the comparison
    # must still say so rather than drop the difference with the None
    comparison = compare_outputs({"d": {"a": None, "b": 1}}, {"d": {"a": torch.ones(2), "b": 1}})
    statuses = {d.path: (d.status, d.detail) for d in comparison.diffs}
    assert statuses == {"d['b']": ("match", ""), "d['a']": ("missing", "missing on the reference")}


def test_finite_differences_too_large_to_square_in_float32_are_measured_in_float64():
    # |Δ| = 1e20 and 3e20: their squares overflow float32, not float64 (a diverged activation, a
    # mask value another run left unset); the metrics are those of the exact values.
    ref = torch.tensor([1e-30, 0.0, 1.0])
    target = torch.tensor([1e20, 3e20, 1.0])
    d = one(ref, target)
    assert d.status == "differ" and d.mismatched == 2
    assert d.rmse == pytest.approx(math.sqrt((1e40 + 9e40) / 3), rel=1e-5)
    aa = 1e-60 + 1.0
    assert d.snr_db == pytest.approx(10 * math.log10(aa / 1e41), rel=1e-5)
    assert d.cosine == pytest.approx(
        1e-30 * 1e20 / math.sqrt(aa * 1.0e41) + 1 / math.sqrt(aa * 1e41), abs=1e-9
    )
    assert d.worst_index == (1,)


def test_bfloat16_differences_beyond_float32_squares_are_measured():
    d = one(torch.tensor([0.0, 1.0], dtype=torch.bfloat16), torch.tensor([1e20, 1.0]).bfloat16())
    exact = float(torch.tensor(1e20).bfloat16())
    assert d.status == "differ" and d.rmse == pytest.approx(exact / math.sqrt(2), rel=1e-6)
    assert d.cosine == pytest.approx(1 / math.sqrt(1 + exact**2), abs=1e-12)
