import json

import plotly.graph_objects as go
from view_model import FALLBACK_OPS

from neuron_workbench.trace.fallback import fallback_table
from neuron_workbench.views import figures


def test_report_data_embeds_both_profiles(data):
    assert data["ref"]["profile"]["time_kind"] == "wall time"
    assert data["target"]["profile"]["time_kind"] == "host CPU time"
    assert data["fallback_ops"] == FALLBACK_OPS


def test_fallback_bar_shows_each_fallback_op_with_count_and_host_time(data):
    fig = figures.fallback_bar(data)
    assert isinstance(fig, go.Figure)
    calls, times = fig.data
    assert sorted(calls.y) == FALLBACK_OPS and list(times.y) == list(calls.y)
    counts = {row.op: row.count for row in fallback_table(data["target"]["fallbacks"])}
    assert dict(zip(calls.y, calls.x)) == counts
    assert all(t >= 0 for t in times.x)
    assert fig.layout.title.text == "CPU fallbacks on neuron (emulated)"
    assert [a.text for a in fig.layout.annotations] == [
        "calls that ran on the CPU",
        "host CPU time (ms)",
    ]
    # each bar knows its call sites (the sort line is in SortNet.forward)
    sort_sites = calls.customdata[list(calls.y).index("aten::sort")]
    assert "view_model.py:" in sort_sites


def test_fallback_bar_without_fallbacks_says_so(data):
    clean = {**data, "target": {**data["target"], "fallbacks": []}}
    fig = figures.fallback_bar(clean)
    assert len(fig.data) == 0
    assert fig.layout.annotations[0].text == "No op fell back to CPU on neuron (emulated)."


def test_module_treemap_groups_ops_under_modules(data):
    (tree,) = figures.module_treemap(data).data
    parent_of = dict(zip(tree.ids, tree.parents))
    label_of = dict(zip(tree.ids, tree.labels))
    assert label_of["m:features.2"] == "features.2 (MaxPool2d)"
    assert parent_of["o:features.2/aten::max_pool2d_with_indices"] == "m:features.2"
    assert parent_of["o:(top level)/aten::sort"] == "m:(top level)"
    values = dict(zip(tree.ids, tree.values))
    root = tree.ids[0]
    assert values[root] == sum(v for i, v in values.items() if i.startswith("m:"))
    assert values[root] == sum(e["count"] for e in data["target"]["fallbacks"])


def test_op_time_bars_compare_ref_and_target_and_mark_fallbacks(data):
    fig = figures.op_time_bars(data, n=50)
    ref, target = fig.data
    assert "wall time" in ref.name and "host CPU time" in target.name
    assert list(ref.y) == list(target.y)
    assert {"aten::convolution", "aten::addmm", "aten::sort"} <= set(target.y)
    color = dict(zip(target.y, target.marker.color))
    assert color["aten::sort"] == "#cf222e" and color["aten::addmm"] != "#cf222e"
    assert all(x >= 0 for x in list(ref.x) + list(target.x))
    assert "host CPU time" in fig.layout.xaxis.title.text
    assert len(figures.op_time_bars(data, n=3).data[0].y) == 3


def test_op_time_bars_without_profile_tell_how_to_get_one(data):
    bare = {**data, "ref": {k: v for k, v in data["ref"].items() if k != "profile"}}
    fig = figures.op_time_bars(bare)
    assert "--profile" in fig.layout.annotations[0].text


def test_memory_bars_use_the_profiles_peak(data):
    fig = figures.memory_bars(data)
    peak, allocated = fig.data
    assert list(peak.x) == ["cpu (as cuda)", "neuron (emulated)"]
    assert peak.y[1] == data["target"]["profile"]["peak_memory_bytes"] > 0
    assert peak.text[0] == "n/a"  # the CPU keeps no allocator statistics
    assert list(allocated.y) == [
        data["ref"]["profile"]["bytes_allocated"],
        data["target"]["profile"]["bytes_allocated"],
    ]


def test_figures_from_saved_json_equal_live_ones(data):
    saved = json.loads(json.dumps(data))
    for build in (
        figures.fallback_bar,
        figures.module_treemap,
        figures.op_time_bars,
        figures.memory_bars,
    ):
        assert build(saved).to_dict() == build(data).to_dict()


def test_call_sites_of_an_op(data):
    sites = figures.call_sites(data, "sort")
    assert sites and sites[0]["file"].endswith("view_model.py")
    assert sites[0]["function"] == "forward" and sites[0]["source"].startswith("fallback")
    # an op that did not fall back is found through the op profile's first call
    conv = figures.call_sites(data, "aten::convolution")
    assert (
        conv
        and conv[0]["source"] == "op profile (first call)"
        and conv[0]["module"] == "features.0"
    )
