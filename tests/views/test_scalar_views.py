"""A training loop's observed scalars in the widget and the static HTML charts, per call site."""

import torch

from neuron_workbench.cell.pipeline import compare_cell
from neuron_workbench.cell.settings import CompareOptions
from neuron_workbench.run import compile_cell
from neuron_workbench.views.widget import ReportView, static_html

LOOP = """model = torch.nn.Linear(4, 1).to("cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    loss = ((model(x.to("cuda")) - y.to("cuda")) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    logged = loss.item()
"""


def test_the_widget_and_the_static_charts_show_each_sites_curve_pair():
    torch.manual_seed(0)
    ns = {"__name__": "__main__", "torch": torch, "x": torch.randn(16, 4), "y": torch.randn(16, 1)}
    report = compare_cell(compile_cell(LOOP), ns, CompareOptions(ref="cpu", target="neuron")).report
    assert report.verdict == "PASS", report.summary()
    (site,) = report.scalars.sites
    view = ReportView(report).build_all()
    figure = view.figures["scalars_0"]
    ref, target, diff = figure.data
    assert list(ref.y) == site.ref and list(target.y) == site.target and len(ref.y) == 10
    assert list(diff.y) == [0.0] * 10 and diff.yaxis == "y2"
    assert figure.layout.title.text.startswith(f"Observed scalars at {site.site} (Tensor.item")
    html = static_html(report.to_dict())
    assert html.count("Plotly.newPlot") >= 1 and "Observed scalars at" in html
