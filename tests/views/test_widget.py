import json
import pathlib
import re

import ipywidgets as W
import plotly.graph_objects as go
import pytest
from plotly.callbacks import InputDeviceState, Points
from view_model import FALLBACK_OPS

import neuron_workbench
from neuron_workbench import views
from neuron_workbench.views.widget import TAB_TITLES, ReportView, static_html


def test_tab_titles_and_lazy_tabs(report):
    view = ReportView(report)
    assert isinstance(view, W.Tab)
    assert view.titles == ("Summary", "Numerics", "Layers", "Ops", "Fallbacks") == TAB_TITLES
    assert view.selected_index == 0
    # only the summary (HTML) is built up front: each FigureWidget costs time in every cell and
    # ships plotly.js to the browser
    assert view.figures == {} and len(view.children[0].children) == 1
    assert view.children[4].children == ()
    view.selected_index = 4
    assert {"fallback_bar", "treemap"} <= set(view.figures)
    html = view.children[4].children[0].value
    for op in FALLBACK_OPS:
        assert op in html
    assert isinstance(view.figures["fallback_bar"], go.FigureWidget)
    assert sorted(view.figures["fallback_bar"].data[0].y) == FALLBACK_OPS


def test_each_tab_shows_its_part_of_the_report(data):
    view = ReportView(data).build_all()
    summary, numerics, layers, ops, fallbacks = (tab.children for tab in view.children)
    assert "PASS" in summary[0].value and "host CPU time" in summary[0].value
    assert "out" in numerics[0].value and "match" in numerics[0].value
    assert "No layer-by-layer comparison" in layers[0].value
    assert isinstance(ops[0], go.FigureWidget) and "aten::addmm" in ops[2].value
    assert ops[-1] is view.figures["memory"]
    assert "target ms (host CPU time)" in ops[2].value
    assert "3 ops fell back to CPU on neuron (emulated)" in fallbacks[0].value


def test_migration_tab_only_with_scanner_findings(data):
    findings = {
        "findings": [
            {
                "rule_id": "NW103",
                "severity": "warning",
                "line": 2,
                "message": "`torch.cuda.Stream` needs CUDA",
                "suggestion": "use `torch.neuron.Stream`",
                "fixable": True,
            }
        ]
    }
    view = ReportView({**data, "migration": findings})
    assert view.titles[-1] == "Migration" and len(view.children) == 6
    view.selected_index = 5
    html = view.children[5].children[0].value
    assert "torch.cuda.Stream" in html and "NW103" in html and "torch.neuron.Stream" in html
    empty = ReportView({**data, "migration": {"findings": []}})
    empty.selected_index = 5
    assert "nothing to migrate" in empty.children[5].children[0].value


def test_layers_tab_renders_a_layer_comparison(data):
    layers = {
        "layers": [
            {
                "module": "features.0",
                "module_type": "Conv2d",
                "order": 0,
                "error": 0.5,
                "diverged": True,
                "born": True,
            }
        ],
        "first_divergence": {"module": "features.0", "module_type": "Conv2d"},
    }
    view = ReportView({**data, "layers": layers})
    view.selected_index = 2
    html = view.children[2].children[0].value
    assert "first divergence" in html and "features.0" in html and "born here" in html


def test_clicking_a_fallback_bar_shows_its_call_sites(report):
    view = ReportView(report)
    view.selected_index = 4
    bar = view.figures["fallback_bar"]
    trace = bar.data[0]
    index = list(trace.y).index("aten::sort")
    trace._dispatch_on_click(
        Points(
            point_inds=[index],
            xs=[trace.x[index]],
            ys=[trace.y[index]],
            trace_name=trace.name,
            trace_index=0,
        ),
        InputDeviceState(),
    )
    assert view.selected_op == "aten::sort"
    pane = view.sites["fallbacks"].value
    assert "Call sites of <code>aten::sort</code>" in pane
    assert re.search(r"view_model\.py:\d+</code> in forward", pane)


def test_clicking_an_op_time_bar_shows_its_call_sites(report):
    view = ReportView(report)
    view.selected_index = 3
    trace = view.figures["op_time"].data[1]
    index = list(trace.y).index("aten::convolution")
    trace._dispatch_on_click(
        Points(
            point_inds=[index],
            xs=[0],
            ys=["aten::convolution"],
            trace_name=trace.name,
            trace_index=1,
        ),
        InputDeviceState(),
    )
    assert "module <code>features.0</code>" in view.sites["ops"].value


def test_display_bundle_has_the_widget_the_verdict_and_static_charts(report, data):
    bundle = ReportView(report)._repr_mimebundle_()
    assert bundle["text/plain"] == data["summary"]
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"]
    html = bundle["text/html"]
    assert html.count('src="https://cdn.plot.ly/') == 1  # plotly.js once, for every chart
    assert html.count("Plotly.newPlot") == 2  # fallbacks and op times
    assert "aten::max_pool2d_with_indices" in html
    # the same data gives byte-identical HTML (no random div ids)
    assert static_html(json.loads(json.dumps(data))) == html


def test_show_report_displays_the_view_only_in_a_kernel(report, monkeypatch, ip):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    assert views.widgets_can_render() is False  # a terminal shell has no frontend
    assert views.show_report(report) is None and shown == []
    monkeypatch.setattr(type(ip), "kernel", object(), raising=False)
    assert views.widgets_can_render() is True
    views.show_report(report)
    assert len(shown) == 1 and isinstance(shown[0], ReportView)


def test_show_report_never_breaks_the_cell(monkeypatch, ip, capsys):
    monkeypatch.setattr(type(ip), "kernel", object(), raising=False)
    views.show_report(object())
    assert "report view unavailable" in capsys.readouterr().err


def _live_widgets():
    """The model ids of the widgets open in this process."""
    from ipywidgets.widgets.widget import _instances

    return set(_instances)


def test_closing_a_view_closes_every_widget_it_made(data):
    # Widget.close closes one widget: a closed view left its two dozen tabs, panes, figures and
    # layouts (and the report data they show) in the kernel
    before = _live_widgets()
    view = ReportView(data).build_all()
    made = _live_widgets() - before
    assert len(made) > 20
    view.close()
    assert not made & _live_widgets()


def test_a_cells_views_are_closed_when_the_cell_shows_new_ones(report, monkeypatch, ip):
    # each run of a cell kept its widgets for the whole session (a training cell run 100 times:
    # 2,300 widgets, about 1 MiB each run); the front end's cell id tells which views a run
    # replaces
    monkeypatch.setattr(type(ip), "kernel", object(), raising=False)
    shown = {}
    for cell in ("a", "b", "a"):
        views.close_cell_views(cell)
        data, _ = views.report_bundle(report, cell_id=cell)
        shown.setdefault(cell, []).append(data[views.WIDGET_VIEW_MIME]["model_id"])
    live = _live_widgets()
    assert shown["a"][0] not in live  # replaced by the cell's second run
    assert {shown["a"][1], shown["b"][0]} <= live
    views.close_cell_views(None)  # no cell id (a terminal shell): nothing to close
    data, _ = views.report_bundle(report)
    assert data[views.WIDGET_VIEW_MIME]["model_id"] in _live_widgets()
    for cell in ("a", "b"):
        views.close_cell_views(cell)


@pytest.mark.parametrize("library", ["plotly", "ipywidgets"])
def test_only_views_import_plotly_and_ipywidgets(library):
    package = pathlib.Path(neuron_workbench.__file__).parent
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "views" not in path.parts
        and re.search(rf"^\s*(import|from) {library}\b", path.read_text(), re.M)
    ]
    assert offenders == []
