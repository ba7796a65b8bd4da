"""The JupyterLab view's torch.compile section (src/charts.js ``compileRows``/``compileFigure``),
run by Node.js on the report of a real compiled ``%%neuron`` cell (default path: target in its
worker)."""

import re

import pytest
from compiled_cells import MLP_SETUP, compiled_mlp_cell

from neuron_workbench.testing import run_cell
from neuron_workbench.views import compile_figures

#: Two input shapes (one recompile on the target) and a function with a print (one graph break).
COMPILED = compiled_mlp_cell((2, 7))

JS = """
const out = {rows: charts.compileRows(report), figure: charts.compileFigure(report),
             plain: charts.compileFigure({...report, ref: {...report.ref, compile: {}},
                                          target: {...report.target, compile: {}}})};
"""


def _times_out(text):
    return re.sub(r"\d+\.\d ms", "_ ms", text)


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_compile_rows_and_chart_of_a_real_compiled_cell(ip, run_charts_js):
    run_cell(ip, MLP_SETUP)
    run_cell(ip, "%neuron_workers restart neuron")  # a fresh target, as in a new notebook
    run_cell(ip, COMPILED)
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    data = report.to_dict()
    out = run_charts_js(JS, data)
    ref, target = out["rows"]
    assert (ref["label"], target["label"]) == ("cpu (as cuda)", "neuron (emulated)")
    assert target["kind"] == "host CPU time" and ref["kind"] == "wall time"
    record = data["target"]["compile"]
    assert len(target["graphs"]) == len(record["graphs"]) >= 3
    assert target["compilers"] == ["neuron"] and ref["compilers"] == ["inductor"]
    assert [b["where"] for b in target["breaks"]] == ["cell line 7"]
    assert "print" in target["breaks"][0]["reason"]
    assert "new shape for args[0]: (2, 8) → (7, 8)" in [r["reason"] for r in target["recompiles"]]
    assert target["compileMs"] == pytest.approx(record["compile_s"] * 1e3)
    wall = data["target"]["wall_time_s"]
    assert target["runMs"] == pytest.approx(max(0.0, wall - record["compile_s"]) * 1e3)
    # each graph's calls and run time, and the graphs' together
    assert [g["calls"] for g in target["graphs"]] == [g["calls"] for g in record["graphs"]]
    assert [g["runMs"] for g in target["graphs"]] == pytest.approx(
        [g["run_s"] * 1e3 for g in record["graphs"]]
    )
    assert target["graphsRunMs"] == pytest.approx(record["run_s"] * 1e3)
    # the chart: a row per graph, its compile time beside its run time; the same as the Python
    # view's chart
    figure = out["figure"]
    python = compile_figures.compile_time_spec(data)
    assert [t["name"] for t in figure["data"]] == [t["name"] for t in python["data"]]
    for js_trace, py_trace in zip(figure["data"], python["data"], strict=True):
        assert js_trace["y"] == py_trace["y"]
        assert js_trace["x"] == pytest.approx(py_trace["x"])
        assert js_trace.get("text") == py_trace.get("text")
        # the same hover text, but for the last digit of times (each language rounds ties its way)
        assert [_times_out(t) for t in js_trace["customdata"]] == [
            _times_out(t) for t in py_trace["customdata"]
        ]
    assert figure["layout"]["title"]["text"] == python["layout"]["title"]["text"]
    assert figure["layout"]["xaxis"]["type"] == python["layout"]["xaxis"]["type"] == "log"
    assert "host CPU time" in figure["layout"]["title"]["text"]
    compile_bars, run_bars = figure["data"]
    assert compile_bars["y"][: len(ref["graphs"])] == [
        f"cpu (as cuda) g{i + 1}" for i in range(len(ref["graphs"]))
    ]
    assert run_bars["text"] == [f"{g['calls']}×" for g in ref["graphs"] + target["graphs"]]
    assert out["plain"] is None  # a report that compiled nothing has no compile chart


def test_a_failed_compile_is_a_row_with_its_error_and_no_chart(run_charts_js):
    # torch.compile(model, dynamic=True) on neuron: the target's only record is the failure
    failed = {
        "graphs": [],
        "graph_breaks": [],
        "recompiles": [],
        "warnings": [],
        "errors": ["BackendCompilerFailed: backend='neuron' raised: NotImplementedError: ..."],
        "compile_s": 0.02,
        "random_ops": {},
    }
    data = {
        "ref": {"label": "cpu (as cuda)", "time_kind": "wall time", "wall_time_s": 0.5},
        "target": {"label": "neuron (emulated)", "time_kind": "host CPU time", "compile": failed},
    }
    out = run_charts_js(
        "const out = {rows: charts.compileRows(report), figure: charts.compileFigure(report)};",
        data,
    )
    [row] = out["rows"]
    assert row["label"] == "neuron (emulated)" and row["graphs"] == [] and row["runMs"] is None
    assert row["graphsRunMs"] is None  # a record from before graphs' run times were kept
    assert row["notes"] == [f"compile failed: {failed['errors'][0]}"]
    assert out["figure"] is None
