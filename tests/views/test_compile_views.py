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
            "calls": 4,
            "run_s": 0.002,
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
            "calls": 2,
            "run_s": 0.001,
            "recompile": "new shape for x: (4, 64) → (4, s0)",
            "fallback_ops": [],
        },
    ],
    "graph_breaks": [],
    "recompiles": [{"function": "forward", "reason": "new shape for x: (4, 64) → (4, s0)"}],
    "warnings": [],
    "errors": [],
    "compile_s": 0.5,
    "run_s": 0.003,
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
            "calls": 1,
            "run_s": 0.003,
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
            "calls": 5,
            "run_s": 0.0025,
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
            "calls": None,
            "run_s": None,
            "recompile": None,
            "fallback_ops": [],
        },
    ],
    "graph_breaks": [{"reason": "print <b>is</b> not traceable", "file": "cell", "line": 6}],
    "recompiles": [{"function": "forward", "reason": "new shape for x: (4, 64) → (4, 65)"}],
    "warnings": ["mode='max-autotune' is ignored on neuron"],
    "errors": [],
    "compile_s": 0.5,  # 0.1 s beyond its graphs: frames Dynamo compiled without a graph
    "run_s": 0.0055,
    "random_ops": {"torch.nn.functional.dropout": 1},
}


@pytest.fixture
def compiled(data):
    ref = {**data["ref"], "wall_time_s": 2.0, "time_kind": "wall time", "compile": REF_RECORD}
    target = {**data["target"], "wall_time_s": 1.5, "time_kind": "host CPU time",
              "compile": TARGET_RECORD}  # fmt: skip
    return {**data, "ref": ref, "target": target}


def test_the_chart_puts_each_graphs_compile_time_beside_its_run_time(compiled):
    spec = compile_figures.compile_time_spec(compiled)
    compile_bars, run_bars = spec["data"]
    rows = ["cpu (as cuda) g1", "cpu (as cuda) g2"]
    rows += ["neuron (emulated) g1", "neuron (emulated) g2", "neuron (emulated) g3"]
    assert compile_bars["y"] == rows and run_bars["y"] == rows
    assert compile_bars["x"] == pytest.approx([400, 100, 200, 150, 50])
    # each graph's own run time (its calls of the compiled callable); a graph whose run time was
    # not recorded has no run bar, and says so
    assert run_bars["x"][:4] == pytest.approx([2.0, 1.0, 3.0, 2.5]) and run_bars["x"][4] is None
    assert run_bars["text"] == ["4×", "2×", "1×", "5×", ""]
    assert "run time not recorded for this graph" in run_bars["customdata"][4]
    assert spec["layout"]["barmode"] == "group" and spec["layout"]["xaxis"]["type"] == "log"
    # the hover says what the graph is, its calls, why it compiled again, what it could not compile
    hover = compile_bars["customdata"]
    assert "run 2.0 ms wall time (4 calls of the compiled graph" in hover[0]
    assert "recompiled: new shape for x: (4, 64) → (4, s0)" in hover[1]
    assert "not compiled: aten::sort" in hover[2]
    assert "(cell line 4)" in hover[2]
    assert "(models.py:6)" in hover[4]
    assert "ms host CPU time" in hover[3]
    assert "(emulated device: host CPU time)" in spec["layout"]["title"]["text"]
    assert spec["layout"]["title"]["text"].startswith(
        "torch.compile: compile vs run time per graph"
    )
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
    # one backend compiled: its graphs' rows only
    ref_only = {**compiled, "target": data["target"]}
    assert {y for t in compile_figures.compile_time_spec(ref_only)["data"] for y in t["y"]} == {
        "cpu (as cuda) g1",
        "cpu (as cuda) g2",
    }


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
        "5.5 ms (host CPU time)",  # the compiled graphs ran
        "1000.0 ms (host CPU time)",
        "<td class=num>5</td><td class=num>2.5 (host CPU time)</td>",  # a graph's calls, run
        "neuron (emulated): warning: mode=&#x27;max-autotune&#x27; is ignored on neuron",
        "torch.nn.functional.dropout",
        "host CPU time, never Trainium or TPU performance",
    ):
        assert expected in text, expected
    # the user's text is escaped
    assert "print &lt;b&gt;is&lt;/b&gt; not traceable" in text and "<b>is</b>" not in text


def test_static_html_carries_the_compile_chart_only_when_compiled(compiled, data):
    assert "run time per graph" not in static_html(data)
    assert "torch.compile: compile vs run time per graph" in static_html(compiled)
