"""The display model: report data carries each run's label and time kinds; renderers read them."""

from neuron_workbench.backends.base import BackendInfo
from neuron_workbench.report.display import (
    format_bytes,
    op_time_kind,
    run_label,
    run_time_kind,
    verdict_color,
)


def backend(**kw):
    return {
        "name": "cpu",
        "device": "cpu",
        "device_name": "",
        "emulated": False,
        "details": {},
        **kw,
    }


def test_run_label_reads_the_label_and_derives_one_only_for_older_data():
    assert run_label({"label": "anything", "backend": backend()}) == "anything"
    cpu = backend(details={"stands_in_for": "cuda"})
    assert run_label({"backend": cpu}) == BackendInfo.from_dict(cpu).label == "cpu (as cuda)"
    assert run_label({"backend": backend(name="neuron", emulated=True)}) == "neuron (emulated)"
    assert run_label({}, "target") == "target"


def test_time_kinds():
    assert run_time_kind(True) == "host CPU time" and run_time_kind(False) == "wall time"
    run = {"time_kind": "wall time", "profile": {"time_kind": "device-synchronized wall time"}}
    assert op_time_kind(run) == "device-synchronized wall time"
    assert op_time_kind({"time_kind": "host CPU time"}) == "host CPU time"
    assert op_time_kind({"backend": backend(emulated=True)}) == "host CPU time"


def test_colors_and_bytes():
    assert verdict_color("PASS") == "#1a7f37" and verdict_color("?") == "#57606a"
    assert format_bytes(None) == "n/a" and format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**20) == "3.0 MiB"


def test_a_report_carries_its_runs_labels():
    import torch

    from neuron_workbench.backends import get_backend
    from neuron_workbench.cell.pipeline import compare_cell
    from neuron_workbench.cell.settings import CompareOptions
    from neuron_workbench.run import compile_cell

    result = compare_cell(
        compile_cell("y = x * 2"), {"x": torch.ones(2)}, CompareOptions(ref="cpu", target="neuron")
    )
    data = result.report.to_dict()
    assert data["target"]["label"] == get_backend("neuron").info().label == "neuron (emulated)"
    assert data["ref"]["label"] == result.report.ref.backend.label


def test_a_difference_where_one_side_is_not_a_number_is_shown_as_such():
    # the figures are over elements finite on both sides: an output NaN on the target and a loss
    # curve turning NaN showed "max |Δ| 0" next to their mismatch
    import dataclasses

    import torch

    from neuron_workbench.compare.compare import compare_outputs
    from neuron_workbench.report.display import largest_difference

    ref = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([1.0, 2.0]), "ok": torch.ones(2)}
    target = {
        "w": torch.tensor([1.0, float("nan")]),
        "b": torch.tensor([1.0, float("inf")]),
        "ok": torch.ones(2) * 1.5,
    }
    diffs = {d.path: dataclasses.asdict(d) for d in compare_outputs(ref, target).compared}
    assert diffs["w"]["max_abs"] == 0.0  # the finite elements' figure, as documented
    assert largest_difference(diffs["w"]) == largest_difference(diffs["w"], "max_rel") == "nan"
    assert largest_difference(diffs["b"]) == "inf"
    assert largest_difference(diffs["ok"]) == 0.5
    site = {"ref": [0.5, 0.25], "target": [0.5, "nan"], "max_abs": 0.0}
    assert largest_difference(site) == "nan"
    assert largest_difference({**site, "target": [0.5, "inf"]}) == "inf"
    assert largest_difference({**site, "target": [0.5, 0.5]}) == 0.0
