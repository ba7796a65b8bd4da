"""The Plotly chart of what ``torch.compile`` did: compile time per graph against run time.

Built from report data only (``data[role]["compile"]``, a ``trace.compile.CompileRecord``'s
``to_dict()``), as the JupyterLab view's ``compileFigure`` (``charts.js``) builds its twin. One
horizontal bar per backend that compiled: a segment per graph Dynamo compiled (its compile time),
then the rest of the run. The record keeps no run time per graph, so run time is the run's time
less its compile time. Emulated devices' times are host CPU time, and every label says so.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from neuron_workbench.report.display import op_time_kind, run_label
from neuron_workbench.views.tables import compile_where, compiled_runs

__all__ = ["compile_time_figure", "compile_time_spec"]

#: Graph segments alternate two shades, so neighbouring graphs stay apart.
_COMPILE_COLORS = ("#bc4c00", "#fb8f44")
_OTHER_COLOR = "#ffd8b5"
_RUN_COLOR = "#0969da"
_FONT = {"family": "system-ui, -apple-system, 'Segoe UI', sans-serif", "size": 12}
_GRID = {"gridcolor": "#eaeef2", "zerolinecolor": "#d0d7de"}


def _graph_hover(index: int, count: int, graph: dict[str, Any], kind: str) -> str:
    lines = [
        f"<b>graph {index} of {count}</b>: {graph.get('function', '')} "
        f"({compile_where(graph) or 'unknown site'})",
        f"{graph.get('backend', '')}, {graph.get('ops', '?')} ops",
        f"compile {float(graph.get('compile_s') or 0.0) * 1e3:.1f} ms {kind}",
    ]
    if graph.get("recompile"):
        lines.append(f"recompiled: {graph['recompile']}")
    if graph.get("fallback_ops"):
        lines.append(f"not compiled: {', '.join(graph['fallback_ops'])}")
    return "<br>".join(lines)


def compile_time_spec(data: dict[str, Any]) -> dict[str, Any] | None:
    """Compile time per graph vs run time, per backend, as a plain plotly spec.

    Each backend that compiled gets one horizontal bar: a segment per graph (its compile time,
    labelled ``g1``, ``g2``...; hover for its function, cell line, ops, recompile reason and the
    ops its compiler could not take), a segment for compile time outside any graph when there is
    some (frames compiled without a graph, failed compiles), then the run time (the run's time
    less its compile time). None when no run compiled a graph.

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
    seg: dict[str, list[Any]] = {k: [] for k in ("y", "x", "base", "text", "color", "hover")}
    other: dict[str, list[Any]] = {k: [] for k in ("y", "x", "base", "hover")}
    run_seg: dict[str, list[Any]] = {k: [] for k in ("y", "x", "base", "hover")}
    kinds = []
    for role, run, record in runs:
        kind = op_time_kind(run)
        label = run_label(run, role)
        kinds.append(f"{label}: {kind}")
        row = f"{label}<br>({kind})"
        graphs = record["graphs"]
        at = 0.0
        for index, graph in enumerate(graphs, start=1):
            ms = float(graph.get("compile_s") or 0.0) * 1e3
            seg["y"].append(row)
            seg["x"].append(ms)
            seg["base"].append(at)
            seg["text"].append(f"g{index}")
            seg["color"].append(_COMPILE_COLORS[(index - 1) % 2])
            seg["hover"].append(_graph_hover(index, len(graphs), graph, kind))
            at += ms
        total = max(float(record.get("compile_s") or 0.0) * 1e3, at)
        if total - at > 0.05:  # Dynamo's frame time beyond its graphs' compile time
            other["y"].append(row)
            other["x"].append(total - at)
            other["base"].append(at)
            other["hover"].append(
                f"<b>{label}</b><br>{total - at:.1f} ms {kind} compiling outside any graph "
                "(frames without a graph, failed compiles)"
            )
        wall = run.get("wall_time_s")
        if wall is not None:
            run_ms = max(0.0, float(wall) * 1e3 - total)
            run_seg["y"].append(row)
            run_seg["x"].append(run_ms)
            run_seg["base"].append(total)
            run_seg["hover"].append(
                f"<b>{label}</b><br>run {run_ms:.1f} ms {kind} (the run less its compile time: "
                f"{len(graphs)} graph{'' if len(graphs) == 1 else 's'} and eager code)<br>"
                f"compile {total:.1f} ms {kind}"
            )
    bar = {"type": "bar", "orientation": "h", "hovertemplate": "%{customdata}<extra></extra>"}
    traces: list[dict[str, Any]] = [
        {**bar, "name": "compile time, one segment per graph", "y": seg["y"], "x": seg["x"],
         "base": seg["base"], "text": seg["text"], "textposition": "inside",
         "insidetextanchor": "middle", "textangle": 0, "customdata": seg["hover"],
         "marker": {"color": seg["color"], "line": {"color": "white", "width": 1}}},
    ]  # fmt: skip
    if other["y"]:
        traces.append(
            {**bar, "name": "compile time outside graphs", "y": other["y"], "x": other["x"],
             "base": other["base"], "customdata": other["hover"],
             "marker": {"color": _OTHER_COLOR, "line": {"color": "white", "width": 1}}}
        )  # fmt: skip
    if run_seg["y"]:
        traces.append(
            {**bar, "name": "run time (the run less its compile time)", "y": run_seg["y"],
             "x": run_seg["x"], "base": run_seg["base"], "customdata": run_seg["hover"],
             "marker": {"color": _RUN_COLOR}}
        )  # fmt: skip
    emulated = any((run.get("backend") or {}).get("emulated") for _, run, _ in runs)
    title = "torch.compile: compile time per graph vs run time" + (
        " (emulated device: host CPU time)" if emulated else ""
    )
    layout = {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 14}},
        "height": 150 + 60 * len(runs),
        "margin": {"l": 10, "r": 10, "t": 80, "b": 50},  # the title, then the legend above
        "font": _FONT,
        "plot_bgcolor": "white",
        "paper_bgcolor": "white",
        # explicit bases: segments sit end to end on their backend's row, never side by side
        "barmode": "overlay",
        "bargap": 0.35,
        "legend": {"orientation": "h", "y": 1.02, "x": 0, "yanchor": "bottom"},
        "xaxis": {"title": {"text": f"ms ({'; '.join(kinds)})"}, "rangemode": "tozero", **_GRID},
        "yaxis": {"automargin": True, "autorange": "reversed", **_GRID},
    }
    return {"data": traces, "layout": layout}


def compile_time_figure(data: dict[str, Any]) -> go.Figure | None:
    """:func:`compile_time_spec` as a figure (for the widget); None when nothing compiled."""
    spec = compile_time_spec(data)
    return None if spec is None else go.Figure(spec)
