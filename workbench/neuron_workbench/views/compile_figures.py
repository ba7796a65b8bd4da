"""The Plotly chart of what ``torch.compile`` did: compile time against run time, per graph.

Built from report data only (``data[role]["compile"]``, a ``trace.compile.CompileRecord``'s
``to_dict()``), as the JupyterLab view's ``compileFigure`` (``charts.js``) builds its twin. One row
per graph Dynamo compiled, reference first: a bar for the time it took to compile and one for the
time its compiled callable ran in the run (its calls: the forward; a training graph's backward runs
inside autograd's backward and is not in it). Compile time dwarfs a graph's run time, so the time
axis is logarithmic. Emulated devices' times are host CPU time, and every label says so.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from neuron_workbench.report.display import op_time_kind, run_label
from neuron_workbench.views.tables import compile_where, compiled_runs

__all__ = ["compile_time_figure", "compile_time_spec"]

_COMPILE_COLOR = "#bc4c00"
_RUN_COLOR = "#0969da"
_FONT = {"family": "system-ui, -apple-system, 'Segoe UI', sans-serif", "size": 12}
_GRID = {"gridcolor": "#eaeef2", "zerolinecolor": "#d0d7de"}


def _calls(count: Any) -> str:
    return "not timed" if count is None else f"{count} call{'' if count == 1 else 's'}"


def _graph_hover(index: int, count: int, graph: dict[str, Any], kind: str) -> str:
    run_s = graph.get("run_s")
    lines = [
        f"<b>graph {index} of {count}</b>: {graph.get('function', '')} "
        f"({compile_where(graph) or 'unknown site'})",
        f"{graph.get('backend', '')}, {graph.get('ops', '?')} ops",
        f"compile {float(graph.get('compile_s') or 0.0) * 1e3:.1f} ms {kind}",
        f"run {float(run_s) * 1e3:.1f} ms {kind} ({_calls(graph.get('calls'))} of the compiled "
        "graph; its backward is not in it)"
        if run_s is not None
        else "run time not recorded for this graph",
    ]
    if graph.get("recompile"):
        lines.append(f"recompiled: {graph['recompile']}")
    if graph.get("fallback_ops"):
        lines.append(f"not compiled: {', '.join(graph['fallback_ops'])}")
    return "<br>".join(lines)


def compile_time_spec(data: dict[str, Any]) -> dict[str, Any] | None:
    """Compile vs run time per graph, as a plain plotly spec.

    Each graph a backend compiled gets a row (``cpu (as cuda) g1``, ...; hover for its function,
    line, ops, recompile reason and the ops its compiler could not take) with two bars: its compile
    time and the host time its compiled callable ran in the run, labelled with its calls. None when
    no run compiled a graph.

    Parameters
    ----------
    data : dict
        Report data (``Report.to_dict()``).

    Returns
    -------
    dict or None
        ``{"data": [...], "layout": {...}}``.
    """
    runs = [
        (role, run, record) for role, run, record in compiled_runs(data) if record.get("graphs")
    ]
    if not runs:
        return None
    comp: dict[str, list[Any]] = {k: [] for k in ("y", "x", "hover")}
    ran: dict[str, list[Any]] = {k: [] for k in ("y", "x", "text", "hover")}
    kinds = []
    for role, run, record in runs:
        kind = op_time_kind(run)
        label = run_label(run, role)
        kinds.append(f"{label}: {kind}")
        graphs = record["graphs"]
        for index, graph in enumerate(graphs, start=1):
            row = f"{label} g{index}"
            hover = _graph_hover(index, len(graphs), graph, kind)
            comp["y"].append(row)
            comp["x"].append(float(graph.get("compile_s") or 0.0) * 1e3)
            comp["hover"].append(hover)
            run_s = graph.get("run_s")
            ran["y"].append(row)
            ran["x"].append(None if run_s is None else float(run_s) * 1e3)
            ran["text"].append("" if graph.get("calls") is None else f"{graph['calls']}×")
            ran["hover"].append(hover)
    bar = {"type": "bar", "orientation": "h", "hovertemplate": "%{customdata}<extra></extra>"}
    traces: list[dict[str, Any]] = [
        {**bar, "name": "compile time", "y": comp["y"], "x": comp["x"],
         "customdata": comp["hover"], "marker": {"color": _COMPILE_COLOR}},
        {**bar, "name": "run time (calls of the compiled graph)", "y": ran["y"], "x": ran["x"],
         "text": ran["text"], "textposition": "outside", "customdata": ran["hover"],
         "marker": {"color": _RUN_COLOR}},
    ]  # fmt: skip
    emulated = any((run.get("backend") or {}).get("emulated") for _, run, _ in runs)
    title = "torch.compile: compile vs run time per graph" + (
        " (emulated device: host CPU time)" if emulated else ""
    )
    rows = len(comp["y"])
    layout = {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        "height": 150 + 44 * rows,
        "margin": {"l": 10, "r": 10, "t": 80, "b": 50},  # the title, then the legend above
        "font": _FONT,
        "plot_bgcolor": "white",
        "paper_bgcolor": "white",
        "barmode": "group",
        "bargap": 0.3,
        "legend": {"orientation": "h", "y": 1.02, "x": 0, "yanchor": "bottom"},
        # compile time is often 100x a graph's run time: a log axis shows both
        "xaxis": {"title": {"text": f"ms, log scale ({'; '.join(kinds)})"}, "type": "log", **_GRID},
        "yaxis": {"automargin": True, "autorange": "reversed", **_GRID},
    }
    return {"data": traces, "layout": layout}


def compile_time_figure(data: dict[str, Any]) -> go.Figure | None:
    """:func:`compile_time_spec` as a figure (for the widget); None when nothing compiled."""
    spec = compile_time_spec(data)
    return None if spec is None else go.Figure(spec)
