"""What ``torch.compile`` did, in the views: the widget's Compile tab and the compile-time chart.

Built from report data; the records here have the shape ``trace.compile.CompileRecord.to_dict()``
gives (a real compiled cell through the default path is in tests/magics/test_neuron_compile_views.py).
"""

import plotly.graph_objects as go
import pytest

from neuron_workbench.views import compile_figures, tables
from neuron_workbench.views.widget import ReportView, static_html

REF_RECORD = {
    "graphs": [
        {
            "backend": "inductor",
            "function": "forward",
            "file": "cell",
            "line": 3,
            "ops": 3,
            "compile_s": 0.4,
            "recompile": None,
            "fallback_ops": [],
        },
        {
            "backend": "inductor",
            "function": "forward",
            "file": "cell",
            "line": 3,
            "ops": 3,
            "compile_s": 0.1,
            "recompile": "new shape for x: (4, 64) → (4, s0)",
            "fallback_ops": [],
        },
    ],
    "graph_breaks": [],
    "recompiles": [{"function": "forward", "reason": "new shape for x: (4, 64) → (4, s0)"}],
    "warnings": [],
    "errors": [],
    "compile_s": 0.5,
    "random_ops": {},
}
TARGET_RECORD = {
    "graphs": [
        {
            "backend": "neuron",
            "function": "forward",
            "file": "cell",
            "line": 4,
            "ops": 5,
            "compile_s": 0.2,
            "recompile": None,
            "fallback_ops": ["aten::sort"],
        },
        {
            "backend": "neuron",
            "function": "forward",
            "file": "cell",
            "line": 4,
            "ops": 5,
            "compile_s": 0.15,
            "recompile": "new shape for x: (4, 64) → (4, 65)",
            "fallback_ops": [],
        },
        {
            "backend": "neuron",
            "function": "torch_dynamo_resume_in_forward_at_6",
            "file": "models.py",
            "line": 6,
            "ops": 1,
            "compile_s": 0.05,
            "recompile": None,
            "fallback_ops": [],
        },
    ],
    "graph_breaks": [{"reason": "print <b>is</b> not traceable", "file": "cell", "line": 6}],
    "recompiles": [{"function": "forward", "reason": "new shape for x: (4, 64) → (4, 65)"}],
    "warnings": ["mode='max-autotune' is ignored on neuron"],
    "errors": [],
    "compile_s": 0.5,  # 0.1 s beyond its graphs: frames Dynamo compiled without a graph
    "random_ops": {"torch.nn.functional.dropout": 1},
}


@pytest.fixture
def compiled(data):
    ref = {**data["ref"], "wall_time_s": 2.0, "time_kind": "wall time", "compile": REF_RECORD}
    target = {**data["target"], "wall_time_s": 1.5, "time_kind": "host CPU time",
              "compile": TARGET_RECORD}  # fmt: skip
    return {**data, "ref": ref, "target": target}


def test_the_chart_puts_each_graphs_compile_time_then_the_run_on_each_backends_bar(compiled):
    spec = compile_figures.compile_time_spec(compiled)
    graphs, outside, run = spec["data"]
    ref_row, target_row = "cpu (as cuda)<br>(wall time)", "neuron (emulated)<br>(host CPU time)"
    assert graphs["y"] == [ref_row] * 2 + [target_row] * 3
    assert graphs["text"] == ["g1", "g2", "g1", "g2", "g3"]
    assert graphs["x"] == pytest.approx([400, 100, 200, 150, 50])
    # segments end to end: each graph starts where the one before it ended
    assert graphs["base"] == pytest.approx([0, 400, 0, 200, 350])
    assert spec["layout"]["barmode"] == "overlay"
    # the hover says what the graph is, why it compiled again, what it could not compile
    assert "recompiled: new shape for x: (4, 64) → (4, s0)" in graphs["customdata"][1]
    assert "not compiled: aten::sort" in graphs["customdata"][2]
    assert "(cell line 4)" in graphs["customdata"][2]
    assert "(models.py:6)" in graphs["customdata"][4]
    assert "ms host CPU time" in graphs["customdata"][3]
    # compile time beyond the graphs' (frames without a graph) is its own segment
    assert outside["y"] == [target_row] and outside["x"] == pytest.approx([100])
    assert outside["base"] == pytest.approx([400])
    # run time: the run's time less its compile time, after the compile segments
    assert run["y"] == [ref_row, target_row]
    assert run["x"] == pytest.approx([1500, 1000]) and run["base"] == pytest.approx([500, 500])
    assert "(emulated device: host CPU time)" in spec["layout"]["title"]["text"]
    axis = spec["layout"]["xaxis"]["title"]["text"]
    assert "cpu (as cuda): wall time" in axis and "neuron (emulated): host CPU time" in axis
    # the widget's figure is the same chart as a validated plotly figure
    fig = compile_figures.compile_time_figure(compiled)
    assert isinstance(fig, go.Figure) and [t.name for t in fig.data] == [
        t["name"] for t in spec["data"]
    ]


def test_no_graph_no_chart(compiled, data):
    assert compile_figures.compile_time_spec(data) is None
    assert compile_figures.compile_time_figure(data) is None
    # a run whose compile failed has no graph to chart, only its error in the tables
    failed = {"graphs": [], "graph_breaks": [], "recompiles": [], "warnings": [],
              "errors": ["BackendCompilerFailed: backend='tpu' raised: RuntimeError: ..."],
              "compile_s": 0.1, "random_ops": {}}  # fmt: skip
    only_error = {**data, "target": {**data["target"], "compile": failed}}
    assert compile_figures.compile_time_spec(only_error) is None
    assert "compile failed: BackendCompilerFailed" in tables.compile_html(only_error)
    # one backend compiled: one bar
    ref_only = {**compiled, "target": data["target"]}
    assert (
        len({y for t in compile_figures.compile_time_spec(ref_only)["data"] for y in t["y"]}) == 1
    )


def test_the_compile_tab_is_there_only_when_a_run_compiled(compiled, data):
    assert "Compile" not in ReportView(data).titles
    view = ReportView({**compiled, "migration": {"findings": [{"rule_id": "NW1", "line": 1}]}})
    assert view.titles[-2:] == ("Compile", "Migration")
    view.selected_index = view.titles.index("Compile")
    chart, html = view.children[view.selected_index].children
    assert chart is view.figures["compile_time"] and isinstance(chart, go.FigureWidget)
    text = html.value
    for expected in (
        "<b>Graphs</b>",
        "<b>Graph breaks</b>",
        "<b>Recompiles</b>",
        "cell line 6",  # the graph break's cell line
        "new shape for x: (4, 64) → (4, 65)",
        "aten::sort",  # the op the target's compiler could not take
        "500.0 ms (host CPU time)",  # compile time, separated from run time
        "1000.0 ms (host CPU time)",
        "neuron (emulated): warning: mode=&#x27;max-autotune&#x27; is ignored on neuron",
        "torch.nn.functional.dropout",
        "host CPU time, never Trainium or TPU performance",
    ):
        assert expected in text, expected
    # the user's text is escaped
    assert "print &lt;b&gt;is&lt;/b&gt; not traceable" in text and "<b>is</b>" not in text


def test_static_html_carries_the_compile_chart_only_when_compiled(compiled, data):
    assert "compile time per graph" not in static_html(data)
    assert "torch.compile: compile time per graph vs run time" in static_html(compiled)
