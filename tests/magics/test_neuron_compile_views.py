"""What ``torch.compile`` did, in the ipywidgets view of a real compiled ``%%neuron`` cell.

Default path (target in its worker): a compiled MLP called with two batch sizes and a compiled
function with a ``print`` inside, as a user writes them; the widget's Compile tab shows both
backends' graphs, the graph break with its cell line, the recompile with its reason, compile time
apart from run time, and the compile-time chart.
"""

import plotly.graph_objects as go
import pytest
from compiled_cells import MLP_SETUP, compiled_mlp_cell

from neuron_workbench.testing import run_cell
from neuron_workbench.views.widget import ReportView

#: Two input shapes (one recompile on the target) and a function with a print (one graph break).
COMPILED = compiled_mlp_cell((3, 5))


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_the_widget_shows_what_compile_did_on_each_backend(ip):
    run_cell(ip, MLP_SETUP)
    run_cell(ip, "%%neuron -o plain\ny = mlp.cuda()(torch.ones(3, 8).cuda())")
    assert "Compile" not in ReportView(ip.user_ns["plain"]).titles  # nothing compiled
    run_cell(ip, COMPILED)
    report = ip.user_ns["r"]
    assert report.verdict == "PASS", report.summary()
    view = ReportView(report)
    view.selected_index = view.titles.index("Compile")
    chart, html = view.children[view.selected_index].children
    text = html.value
    data = report.to_dict()
    for role, compiler in (("ref", "inductor"), ("target", "neuron")):
        record = data[role]["compile"]
        label = data[role]["label"]
        assert f"<td>{label}</td><td>{compiler}</td><td class=num>{len(record['graphs'])}</td>" in (
            text
        )
        assert f"{record['compile_s'] * 1e3:.1f} ms ({data[role]['time_kind']})" in text
    # the print broke the graph on both backends, at its cell line (the %%neuron line is 1)
    assert text.count('<code class="nw-path">cell line 7</code></td><td>Dynamo does not know') == 2
    # the second batch size compiled the MLP again on the target (static shapes), with its reason
    assert "new shape for args[0]: (3, 8) → (5, 8)" in text
    assert "host CPU time, never Trainium or TPU performance" in text
    # each graph's calls and run time, in the graphs table
    for role in ("ref", "target"):
        for graph in data[role]["compile"]["graphs"]:
            kind = data[role]["time_kind"]
            cells = f"<td class=num>{graph['calls']}</td><td class=num>{graph['run_s'] * 1e3:.1f} ({kind})</td>"
            assert cells in text, cells
    # the chart: each graph's compile time beside its run time, a row per graph
    assert chart is view.figures["compile_time"] and isinstance(chart, go.FigureWidget)
    compile_bars, run_bars = chart.data
    ref_graphs, target_graphs = (data[r]["compile"]["graphs"] for r in ("ref", "target"))
    assert list(compile_bars.y) == [f"cpu (as cuda) g{i + 1}" for i in range(len(ref_graphs))] + [
        f"neuron (emulated) g{i + 1}" for i in range(len(target_graphs))
    ]
    assert list(run_bars.x) == pytest.approx([g["run_s"] * 1e3 for g in ref_graphs + target_graphs])
    # the MLP ran once per shape; the target compiled it per shape: one call per graph there
    assert [g["calls"] for g in target_graphs] == [1] * len(target_graphs)
    assert run_bars.name == "run time (calls of the compiled graph)"
    assert "host CPU time" in chart.layout.title.text
