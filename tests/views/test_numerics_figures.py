"""Layer-divergence and training-parity charts built from real %%neuron reports."""

from neuron_workbench.testing import run_cell
from neuron_workbench.views import figures
from neuron_workbench.views.widget import ReportView

DEEP = """
import torch
import torch.nn as nn

class Float64Sensitive(nn.Module):
    def forward(self, x):
        return ((x.double() + 1e8) - 1e8).float()

torch.manual_seed(0)
deep = nn.Sequential(*[Float64Sensitive() if i == 5 else nn.Linear(8, 8) for i in range(10)])
"""


def test_layer_error_chart_marks_the_born_module(ip):
    run_cell(ip, DEEP)
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron --layers -o r\nout = deep.cuda()(torch.randn(4, 8, device='cuda'))",
    )
    data = ip.user_ns["r"].to_dict()
    fig = figures.layer_errors(data)
    bars = fig.data[0]
    born = [label for label, state in zip(bars.x, bars.customdata) if state == "born here"]
    assert born == ["5: 5"]
    assert "born at 5" in fig.layout.title.text
    view = ReportView(data).build_all()
    assert "layer_errors" in view.figures


def test_loss_curves_overlay_both_runs(ip):
    run_cell(ip, "import torch\nw = torch.ones(3)")
    run_cell(
        ip,
        "%%neuron --ref cpu --target neuron --steps 3 -o r\nw = w.to('cuda') * 2\nloss = w.sum()",
    )
    data = ip.user_ns["r"].to_dict()
    fig = figures.loss_curves(data)
    assert list(fig.data[0].y) == [6.0, 12.0, 24.0] == list(fig.data[1].y)
    assert list(fig.data[2].y) == [0.0, 0.0, 0.0]
    assert figures.loss_curves({"training": None}) is None
    assert figures.layer_errors({"layers": None}) is None
