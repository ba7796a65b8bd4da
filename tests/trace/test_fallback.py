import pytest
from trace_model import CELL_FORWARD_LINE, CELL_SORT_LINES, EXPECTED_FALLBACKS, pool_line

from neuron_workbench.trace.fallback import (
    cross_check,
    fallback_table,
    normalize_op,
    strict_message,
    strict_violations,
)


def test_fallback_report_lists_exactly_the_non_native_ops_with_counts(profiled_runs):
    _, runs = profiled_runs
    rows = fallback_table(runs["neuron"].fallbacks)
    assert {row.op: row.count for row in rows} == EXPECTED_FALLBACKS
    assert [row.op for row in rows][0] == "aten::sort"  # most frequent first
    assert all(row.cpu_time_s >= 0 for row in rows)
    assert fallback_table(runs["cpu"].fallbacks) == []


def test_fallback_rows_carry_source_lines_modules_and_shapes(profiled_runs):
    program, runs = profiled_runs
    rows = {row.op: row for row in fallback_table(runs["neuron"].fallbacks)}
    sort = rows["aten::sort"]
    assert sort.sites == [(program.filename, line) for line in CELL_SORT_LINES]
    assert sort.shapes == ["[2, 5]"] and sort.dtypes == ["float32"]
    assert sort.phases == ["forward"] and sort.modules == [""]

    pool = rows["aten::max_pool2d_with_indices"]
    assert [line for _, line in pool.sites] == [pool_line()]
    assert pool.sites[0][0].endswith("trace_model.py") and pool.functions == ["forward"]
    assert pool.modules == ["pool"] and pool.module_types == ["MaxPool2d"]
    assert pool.shapes == ["[2, 4, 14, 14]"]

    backward = rows["aten::max_pool2d_with_indices_backward"]
    assert backward.phases == ["backward"]
    assert backward.autograd_nodes == ["MaxPool2DWithIndicesBackward0"]
    # the backward op names the forward op's line (matched through the autograd graph)
    assert [line for _, line in backward.sites] == [pool_line()]
    assert CELL_FORWARD_LINE not in [line for _, line in pool.sites]


def test_strict_fails_on_fallbacks_and_allow_fallback_exempts_them(profiled_runs):
    _, runs = profiled_runs
    events = runs["neuron"].fallbacks
    assert strict_violations(events, []) == sorted(EXPECTED_FALLBACKS)
    assert strict_violations(runs["cpu"].fallbacks, []) == []
    # both spellings, and overload spellings, are accepted
    allowed = ["sort", "aten::max_pool2d_with_indices", "max_pool2d_with_indices_backward.default"]
    assert strict_violations(events, allowed) == []
    assert strict_violations(events, ["aten::sort", " "]) == [
        "aten::max_pool2d_with_indices",
        "aten::max_pool2d_with_indices_backward",
    ]


def test_strict_message_is_one_line_naming_the_ops_and_the_flag():
    msg = strict_message(["aten::sort", "aten::max_pool2d_with_indices"], backend="neuron")
    assert msg == (
        "strict mode: 2 ops fell back to CPU on neuron: aten::sort, aten::max_pool2d_with_indices "
        "(allow them with --allow-fallback aten::sort,aten::max_pool2d_with_indices)"
    )
    assert "\n" not in msg
    assert strict_message(["aten::sort"]).startswith("strict mode: 1 op fell back to CPU on neuron")


@pytest.mark.parametrize(
    ("spelling", "base"),
    [
        ("sort", "aten::sort"),
        ("aten::add.Tensor", "aten::add"),
        ("torchvision::nms", "torchvision::nms"),
    ],
)
def test_op_spellings_normalise_to_base_names(spelling, base):
    assert normalize_op(spelling) == base


def test_name_only_events_are_cross_checked_with_the_op_profile(profiled_runs):
    program, runs = profiled_runs
    profile = runs["neuron"].extras["profile"]
    # what real TorchNeuron's get_fallback_ops() gives: unique names, no counts
    name_only = [
        {"op": "aten::sort", "count": None, "source": "torch_neuronx.get_fallback_ops"},
        {"op": "aten::max_pool2d_with_indices", "count": None},
    ]
    rows = {row.op: row for row in fallback_table(name_only)}
    assert rows["aten::sort"].count is None and rows["aten::sort"].cpu_time_s is None
    checked = cross_check(name_only, profile.to_dict())
    rows = {row.op: row for row in fallback_table(checked)}
    assert rows["aten::sort"].count == 3
    assert rows["aten::sort"].sites == [(program.filename, CELL_SORT_LINES[0])]
    assert rows["aten::max_pool2d_with_indices"].count == 2
    assert rows["aten::max_pool2d_with_indices"].modules == ["pool"]
    assert "op profile" in checked[0]["source"]
    # events that already have counts are left alone
    assert cross_check(runs["neuron"].fallbacks, profile) == runs["neuron"].fallbacks
