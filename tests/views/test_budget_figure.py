"""The precision budget's picture: an output's error distribution against the reference's floor."""

import torch

from neuron_workbench.backends import get_backend
from neuron_workbench.compare.budget import measure_budget
from neuron_workbench.run import RunSpec, compile_cell, execute
from neuron_workbench.views import figures
from neuron_workbench.views.widget import ReportView, static_html

REF = "x = torch.randn(32, 32)\ny = torch.softmax(x @ x, dim=-1)"
#: The same cell with the target's bug: the softmax over the wrong axis.
BUGGY = "x = torch.randn(32, 32)\ny = torch.softmax(x @ x, dim=0)"


def _budget_data(data):
    spec = RunSpec(compile_cell(REF), {"torch": torch})
    cpu = get_backend("cpu")
    ref = execute(spec, cpu)
    target = execute(RunSpec(compile_cell(BUGGY), {"torch": torch}), cpu)
    budget = measure_budget(spec, cpu, ref, target)
    return {**data, "budget": budget.to_dict()}


def test_the_histogram_shows_the_worst_output_against_the_noise_floor(data):
    with_budget = _budget_data(data)
    fig = figures.budget_histogram(with_budget)
    ref, target = fig.data
    assert ref.name.endswith("− oracle") and target.name.endswith("− oracle")
    assert fig.layout.title.text.startswith("Error distribution of y: R ")
    assert fig.layout.title.text.endswith("less accurate")
    # every element of y is counted once per run (x is exact on both: it has no histogram)
    assert sum(ref.y) == sum(target.y) == 32 * 32
    hist = next(o for o in with_budget["budget"]["outputs"] if o["path"] == "y")["histogram"]
    # the bug's errors sit in higher bins than the reference's rounding
    top_ref = max(i for i, c in enumerate(hist["ref"]) if c)
    assert sum(hist["target"][top_ref + 1 :]) > 0.5 * 32 * 32


def test_no_budget_no_figure_and_the_widget_shows_it_in_numerics(data):
    assert figures.budget_histogram(data) is None
    view = ReportView(_budget_data(data)).build_all()
    assert "budget" in view.figures
    assert "budget" not in ReportView(data).build_all().figures


def test_static_exports_keep_the_picture(data):
    assert "Error distribution of y" in static_html(_budget_data(data))
    assert "Error distribution" not in static_html(data)
