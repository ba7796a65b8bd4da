"""The extension's Plotly figure builders (src/charts.js) on real report data, run by Node.js.

The browser test checks the drawn charts; this one checks every builder's figure (what each chart
plots, what its hover says, what a click lists) quickly, including the ``--layers`` and ``--steps``
charts, on a report the workbench really produced.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(ROOT / "tests" / "views"))
from view_model import FALLBACK_OPS, make_report  # noqa: E402

#: Every chart of the report and the helpers the view labels with, as the view builds them.
FIGURES = """
const out = {};
for (const [key, build] of Object.entries(charts.CHARTS)) {
  out[key] = build(report);
}
out.sites = Object.fromEntries(charts.fallbackRows(report).map(r => [r.op, charts.callSites(report, r.op)]));
out.labels = [charts.siteLabel({file: 'cell [7]', line: 3}), charts.siteLabel({file: 'models.py', line: 16}),
              charts.siteLabel({file: '<neuron-cell-2>', line: 4})];
out.backendLabels = [report.ref, report.target, {...report.ref, label: undefined},
                     {...report.target, label: undefined}].map(charts.backendLabel);
"""


def _relabelled(data):
    """The report as the magic relabels it: files relative to the folder that holds them."""
    from neuron_workbench.sites import relabel_site

    for event in data["target"]["fallbacks"]:
        if event.get("site"):
            event["site"] = relabel_site(event["site"], {}, [str(ROOT / "tests" / "views")])
    return data


def _line_of(text):
    """The line of view_model.py that holds ``text`` (where its ops are called)."""
    source = (ROOT / "tests" / "views" / "view_model.py").read_text().splitlines()
    return next(number for number, line in enumerate(source, 1) if text in line)


def test_fallback_treemap_op_time_and_memory_figures(run_charts_js):
    data = _relabelled(make_report().to_dict())
    sort_site = f"view_model.py:{_line_of('torch.sort(y')}"
    pool_site = f"view_model.py:{_line_of('self.head(torch.flatten(self.features(x)')}"
    figs = run_charts_js(FIGURES, data)
    calls, time = figs["fallbacks"]["data"]
    assert sorted(calls["y"]) == FALLBACK_OPS and calls["type"] == time["type"] == "bar"
    assert time["xaxis"] == "x2"  # by count and by time, side by side
    assert "call(s) ran on the CPU" in calls["hovertemplate"]
    sort_index = calls["y"].index("aten::sort")
    assert calls["x"][sort_index] == sum(
        e["count"] for e in data["target"]["fallbacks"] if e["op"] == "aten::sort"
    )
    assert calls["customdata"][sort_index] == sort_site
    sites = figs["sites"]["aten::sort"]
    assert sites[0]["label"] == sort_site and sites[0]["cell"] is None
    pool = figs["sites"]["aten::max_pool2d_with_indices"]
    assert {s["module"] for s in pool} == {"features.2"}
    assert pool[0]["moduleType"] == "MaxPool2d" and pool[0]["label"] == pool_site
    treemap = figs["treemap"]["data"][0]
    assert treemap["type"] == "treemap" and set(FALLBACK_OPS) <= set(treemap["labels"])
    assert treemap["values"][0] == sum(e["count"] for e in data["target"]["fallbacks"])
    ref, native, fallback = figs["ops"]["data"]
    # the 15 slowest ops of either run (which ones depends on this host's timings)
    assert ref["y"] == native["y"] == fallback["y"] and 0 < len(ref["y"]) <= 15
    # the target's ops that fell back are their own (red) trace in the same slot
    for op, on_device, on_cpu in zip(fallback["y"], native["x"], fallback["x"]):
        assert (on_cpu is not None) == (op in FALLBACK_OPS) != (on_device is not None), op
    assert native["offsetgroup"] == fallback["offsetgroup"] == "target"
    memory = figs["memory"]["data"]
    assert memory[0]["x"] == ["cpu (as cuda)", "neuron (emulated)"]
    assert figs["layers"] is None and figs["loss"] is None  # no --layers, no --steps
    assert figs["labels"] == ["cell [7], line 3", "models.py:16", "cell line 4"]
    # the data's labels, and for reports of schema_version 1 (no label) the same, derived
    assert figs["backendLabels"] == [data["ref"]["label"], data["target"]["label"]] * 2
    assert data["target"]["label"] == "neuron (emulated)"


def test_layers_and_loss_figures(run_charts_js):
    data = make_report().to_dict()
    data["layers"] = {
        "layers": [
            {"order": 0, "module": "features.0", "call": 0, "module_type": "Conv2d",
             "error": 0.0, "born": False, "diverged": False, "grad_error": None},
            {"order": 1, "module": "head", "call": 0, "module_type": "Linear",
             "error": 2.5e-3, "born": True, "diverged": True, "grad_error": 1e-4},
        ],
        "first_divergence": {"module": "head"},
    }  # fmt: skip
    data["training"] = {"steps": 3, "series": {"loss": {
        "ref": [1.0, 0.9, 0.8], "target": [1.0, 0.91, 0.79], "abs_diff": [0.0, 0.01, 0.01]}}}  # fmt: skip
    figs = run_charts_js(FIGURES, data)
    bars, grads = figs["layers"]["data"]
    assert bars["x"] == ["0: features.0", "1: head"] and bars["y"][1] == 2.5e-3
    assert 0 < bars["y"][0] < 2.5e-3  # an exact match sits under the smallest difference
    assert figs["layers"]["layout"]["yaxis"]["type"] == "log"
    assert "born at head" in figs["layers"]["layout"]["title"]["text"]
    assert grads["y"] == [None, 1e-4]
    ref, target, diff = figs["loss"]["data"]
    assert ref["y"] == [1.0, 0.9, 0.8] and target["y"] == [1.0, 0.91, 0.79]
    assert diff["yaxis"] == "y2" and diff["y"] == [0.0, 0.01, 0.01]
