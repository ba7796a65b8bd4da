"""The report's measurements in the widget: side by side with what each value is, never diffed."""

import torch

from neuron_workbench.backends import BackendInfo
from neuron_workbench.compare import compare_outputs
from neuron_workbench.report.report import Report
from neuron_workbench.run import Run
from neuron_workbench.run.measurements import Provenance, TaggedFloat
from neuron_workbench.views.tables import measurements_html, numerics_html
from neuron_workbench.views.widget import ReportView

CPU = BackendInfo("cpu", "cpu", "host", details={"stands_in_for": "cuda"})
NEURON = BackendInfo("neuron", "neuron:0", "emulated neuron (host CPU)", emulated=True)
MS = Provenance("time", "torch.cuda.Event.elapsed_time", "ms")


def data(ref_out, target_out):
    report = Report(
        Run(CPU, outputs=ref_out),
        Run(NEURON, outputs=target_out),
        compare_outputs(ref_out, target_out),
    )
    return report.to_dict()


def test_the_numerics_tab_shows_measurements_with_their_basis():
    report = data(
        {"step_ms": TaggedFloat(12.25, MS), "y": torch.ones(2)},
        {"step_ms": TaggedFloat(30.5, MS), "y": torch.ones(2)},
    )
    html = measurements_html(report)
    assert "<code>step_ms</code>" in html and "12.25 ms" in html and "30.5 ms" in html
    assert "host CPU time (emulated device)" in html
    assert "host CPU time (cpu standing in for cuda)" in html
    assert "step_ms" not in numerics_html(report)
    view = ReportView(report).build_all()
    assert any("nw-measurements" in getattr(w, "value", "") for w in view.children[1].children)


def test_no_measurements_no_table():
    assert measurements_html(data({"y": 1.0}, {"y": 1.0})) == ""


def test_a_cell_of_measurements_only_says_so():
    html = numerics_html(data({"t": TaggedFloat(1.0, MS)}, {"t": TaggedFloat(2.0, MS)}))
    assert "the cell bound only measurements" in html
