"""The JupyterLab view's measurement rows (src/charts.js ``measurementRows``), run by Node.js on
report data the workbench produced."""

from neuron_workbench.backends import BackendInfo
from neuron_workbench.compare import compare_outputs
from neuron_workbench.report.report import Report
from neuron_workbench.run import Run
from neuron_workbench.run.measurements import Provenance, TaggedFloat, TaggedStr


def test_measurement_rows_show_both_values_with_unit_and_basis(run_charts_js):
    ms = Provenance("time", "torch.cuda.Event.elapsed_time", "ms")
    name = Provenance("device", "torch.cuda.get_device_name")
    ref_out = {"step_ms": TaggedFloat(12.25, ms), "gpu": TaggedStr("x86_64", name), "y": 1.0}
    target_out = {"step_ms": TaggedFloat(30.5, ms), "gpu": TaggedStr("neuron:0", name), "y": 1.0}
    cpu = BackendInfo("cpu", "cpu", "host", details={"stands_in_for": "cuda"})
    neuron = BackendInfo("neuron", "neuron:0", "emulated", emulated=True)
    report = Report(
        Run(cpu, outputs=ref_out),
        Run(neuron, outputs=target_out),
        compare_outputs(ref_out, target_out),
    )
    rows = run_charts_js("const out = charts.measurementRows(report);", report.to_dict())
    assert [(r["path"], r["ref"], r["target"]) for r in rows] == [
        ("step_ms", "12.25 ms", "30.5 ms"),
        ("gpu", "x86_64", "neuron:0"),
    ]
    assert rows[0]["basis"] == (
        "reference: host CPU time (cpu standing in for cuda); "
        "target: host CPU time (emulated device)"
    )
