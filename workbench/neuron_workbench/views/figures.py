"""Plotly figures of a report, built from ``Report.to_dict()`` data only (saved reports look the same).

Each builder returns a plain ``go.Figure``; the widget view wraps them in ``go.FigureWidget`` and the
static view embeds their JSON. Emulated timings are labelled as host CPU time on every axis.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from neuron_workbench.report.display import format_bytes, op_time_kind
from neuron_workbench.sites import site_label
from neuron_workbench.trace.fallback import FallbackRow, fallback_table, normalize_op
from neuron_workbench.views.figure_style import (
    FALLBACK_COLOR,
    GRID,
    REF_COLOR,
    TARGET_COLOR,
    page_layout,
    run_label_of,
)
from neuron_workbench.views.scalar_figures import (
    scalar_curves,
    scalar_curves_specs,
)

__all__ = [
    "budget_histogram",
    "call_sites",
    "fallback_bar",
    "fallback_rows",
    "layer_errors",
    "loss_curves",
    "memory_bars",
    "module_treemap",
    "op_time_bars",
    "profile_frame",
    "scalar_curves",
    "scalar_curves_specs",
]


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(**page_layout(title, height))
    fig.update_xaxes(**GRID)
    fig.update_yaxes(**GRID)
    return fig


def _layout_spec(
    spec: dict[str, Any], title: str, height: int, axes: tuple[str, ...] = ("xaxis", "yaxis")
) -> dict[str, Any]:
    """:func:`_layout` for a plain figure spec (``{"data": [...], "layout": {...}}``)."""
    layout = spec.setdefault("layout", {})
    layout.update(page_layout(title, height))
    for axis in axes:
        layout.setdefault(axis, {}).update(GRID)
    return spec


def _empty_spec(title: str, message: str, height: int = 180) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "data": [],
        "layout": {
            "annotations": [
                {
                    "text": message,
                    "showarrow": False,
                    "x": 0.5,
                    "y": 0.5,
                    "xref": "paper",
                    "yref": "paper",
                    "font": {"size": 13, "color": "#57606a"},
                }
            ],  # fmt: skip
            "xaxis": {"visible": False},
            "yaxis": {"visible": False},
        },
    }
    return _layout_spec(spec, title, height)


def _empty(title: str, message: str, height: int = 180) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(
        text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
        font={"size": 13, "color": "#57606a"},
    )  # fmt: skip
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height)


def fallback_rows(data: dict[str, Any]) -> list[FallbackRow]:
    """The target run's fallback events of a report, aggregated per op (most frequent first)."""
    return fallback_table(list(data.get("target", {}).get("fallbacks", [])))


def fallback_bar(data: dict[str, Any]) -> go.Figure:
    """CPU-fallback ops of the target run: calls (left) and host CPU time (right), one bar each.

    Bars carry the op's call sites as ``customdata`` (for click handlers and hover text).
    """
    return go.Figure(fallback_bar_spec(data))


def fallback_bar_spec(data: dict[str, Any]) -> dict[str, Any]:
    """:func:`fallback_bar` as a plain plotly spec.

    Static HTML needs no figure objects, whose validation costs milliseconds on every cell.
    """
    rows = fallback_rows(data)
    target = run_label_of(data, "target")
    title = f"CPU fallbacks on {target}"
    if not rows:
        return _empty_spec(title, f"No op fell back to CPU on {target}.")
    rows = rows[::-1]  # plotly draws the first category at the bottom
    ops = [row.op for row in rows]
    sites = ["<br>".join(site_label(file, line) for file, line in row.sites) or "backward / library code"
             for row in rows]  # fmt: skip
    # Two panels sharing the op axis (laid out by hand: make_subplots costs ~30 ms per figure).
    spec: dict[str, Any] = {
        "data": [
            {"type": "bar", "name": "calls", "y": ops, "x": [row.count or 0 for row in rows],
             "orientation": "h", "marker": {"color": FALLBACK_COLOR}, "customdata": sites,
             "text": [row.count for row in rows], "textposition": "auto", "xaxis": "x",
             "yaxis": "y",
             "hovertemplate": "<b>%{y}</b><br>%{x} call(s) on CPU<br>%{customdata}<extra></extra>"},
            {"type": "bar", "name": "host CPU time (ms)", "y": ops,
             "x": [(row.cpu_time_s or 0.0) * 1e3 for row in rows], "orientation": "h",
             "marker": {"color": "#bc4c00"}, "customdata": sites, "xaxis": "x2", "yaxis": "y",
             "hovertemplate": "<b>%{y}</b><br>%{x:.3f} ms host CPU time<br>%{customdata}"
                              "<extra></extra>"},
        ],
        "layout": {
            "xaxis": {"domain": [0.0, 0.485]},
            "xaxis2": {"domain": [0.515, 1.0], "anchor": "y"},
            "yaxis": {"automargin": True},
            "annotations": [
                {"text": text, "x": x, "y": 1.0, "xref": "paper", "yref": "paper",
                 "xanchor": "center", "yanchor": "bottom", "showarrow": False,
                 "font": {"size": 13}}
                for text, x in (("calls that ran on the CPU", 0.2425), ("host CPU time (ms)", 0.7575))
            ],
            "showlegend": False,
            "bargap": 0.25,
        },
    }  # fmt: skip
    return _layout_spec(spec, title, 140 + 34 * len(rows), axes=("xaxis", "xaxis2", "yaxis"))


def layer_errors(data: dict[str, Any]) -> go.Figure | None:
    """Divergence per module call in execution order (``--layers``); None without layer data.

    Bars are the size of each call's output difference, red where the divergence was born, amber
    where it was only propagated; a second trace shows the output-gradient difference when the
    cell ran backward.
    """
    layers = (data.get("layers") or {}).get("layers") or []
    if not layers:
        return None
    labels = [f"{d['order']}: {d['module']}" + (f"#{d['call']}" if d.get("call") else "")
              for d in layers]  # fmt: skip

    def size(value: Any) -> float:
        value = float(value) if value is not None and value != "inf" else float("inf")
        return value if value != float("inf") else 1e30

    colors = [FALLBACK_COLOR if d["born"] else ("#bf8700" if d["diverged"] else REF_COLOR)
              for d in layers]  # fmt: skip
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            name="output difference", x=labels, y=[max(size(d["error"]), 1e-30) for d in layers],
            marker_color=colors,
            customdata=[("born here" if d["born"] else "propagated" if d["diverged"] else "ok")
                        for d in layers],
            hovertemplate="<b>%{x}</b><br>difference %{y:.3g}<br>%{customdata}<extra></extra>",
        )
    )  # fmt: skip
    if any(d.get("grad_error") is not None for d in layers):
        fig.add_trace(
            go.Scatter(
                name="output-gradient difference", x=labels, mode="markers",
                y=[max(size(d.get("grad_error")), 1e-30) if d.get("grad_error") is not None
                   else None for d in layers],
                marker={"color": TARGET_COLOR, "symbol": "diamond", "size": 8},
            )
        )  # fmt: skip
    first = (data.get("layers") or {}).get("first_divergence")
    title = "Difference per module, in execution order" + (
        f" (born at {first['module']})" if first else ""
    )
    fig.update_yaxes(type="log", title_text="difference (log)")
    fig.update_xaxes(tickangle=-45, automargin=True)
    return _layout(fig, title, 380)


def loss_curves(data: dict[str, Any]) -> go.Figure | None:
    """Per-step values of both runs (``--steps N``), and their difference; None without steps."""
    training = data.get("training")
    if not training or not training.get("series"):
        return None
    series = training["series"]
    name = "loss" if "loss" in series else next(iter(series))
    values = series[name]
    steps = list(range(1, len(values["ref"]) + 1))
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            name=f"{name}: {run_label_of(data, 'ref')}",
            x=steps,
            y=values["ref"],
            mode="lines+markers",
            line={"color": REF_COLOR},
        )
    )
    fig.add_trace(
        go.Scatter(
            name=f"{name}: {run_label_of(data, 'target')}",
            x=steps,
            y=values["target"],
            mode="lines+markers",
            line={"color": TARGET_COLOR, "dash": "dot"},
        )
    )
    fig.add_trace(
        go.Bar(
            name="|Δ| per step",
            x=steps,
            y=values["abs_diff"],
            yaxis="y2",
            marker_color=FALLBACK_COLOR,
            opacity=0.35,
        )
    )
    fig.update_layout(
        xaxis={"title": {"text": "step"}, "dtick": 1},
        yaxis2={"overlaying": "y", "side": "right", "title": {"text": "|Δ|"}, "showgrid": False},
    )
    return _layout(fig, f"Training parity over {len(steps)} steps: {name}", 320)


#: Call sites charted per report (the first seen; the report's data holds them all).
def module_treemap(data: dict[str, Any]) -> go.Figure:
    """Treemap module → op of the target's CPU fallbacks, sized by calls."""
    events = list(data.get("target", {}).get("fallbacks", []))
    target = run_label_of(data, "target")
    title = f"Fallbacks by module on {target}"
    if not events:
        return _empty(title, "No fallbacks.")
    per: dict[tuple[str, str], list[float]] = {}
    types: dict[str, str] = {}
    for event in events:
        module = str(event.get("module") or "")
        if event.get("phase") == "backward" and not module:
            module = "(backward)"
        module = module or "(top level)"
        if event.get("module_type"):
            types.setdefault(module, str(event["module_type"]))
        key = (module, normalize_op(event["op"]))
        acc = per.setdefault(key, [0.0, 0.0])
        acc[0] += float(event.get("count") or 1)
        acc[1] += float(event.get("cpu_time_s") or 0.0)
    root = f"{target} fallbacks"
    ids, labels, parents, values, times = [root], [root], [""], [0.0], [0.0]
    modules: dict[str, int] = {}
    for (module, op), (count, seconds) in sorted(per.items()):
        if module not in modules:
            modules[module] = len(ids)
            label = module
            if module in types:
                label = (
                    f"{types[module]} {module}"
                    if module.startswith("(")
                    else f"{module} ({types[module]})"
                )
            ids.append(f"m:{module}")
            labels.append(label)
            parents.append(root)
            values.append(0.0)
            times.append(0.0)
        index = modules[module]
        values[index] += count
        times[index] += seconds
        values[0] += count
        times[0] += seconds
        ids.append(f"o:{module}/{op}")
        labels.append(op)
        parents.append(f"m:{module}")
        values.append(count)
        times.append(seconds)
    fig = go.Figure(
        go.Treemap(
            ids=ids, labels=labels, parents=parents,
            values=values, branchvalues="total",
            customdata=[t * 1e3 for t in times],
            hovertemplate="<b>%{label}</b><br>%{value} calls<br>%{customdata:.3f} ms host CPU time"
                          "<extra></extra>",
        )
    )  # fmt: skip
    return _layout(fig, title + " (size: calls)", 360)


def profile_frame(data: dict[str, Any], phase: str = "steady") -> Any:
    """The report's two op profiles joined by op (``compare.profile_diff.profile_diff``), or None."""
    ref = data.get("ref", {}).get("profile")
    target = data.get("target", {}).get("profile")
    if not ref or not target:
        return None
    from neuron_workbench.compare.profile_diff import profile_diff

    return profile_diff(ref, target, data.get("fallback_ops", []), phase=phase)


def op_time_bars(data: dict[str, Any], n: int = 15) -> go.Figure:
    """Per-op time of the reference and the target side by side (top ``n`` by the larger time).

    Target bars of ops that fell back to the CPU are drawn in red.
    """
    return go.Figure(op_time_bars_spec(data, n))


def op_time_bars_spec(data: dict[str, Any], n: int = 15) -> dict[str, Any]:
    """:func:`op_time_bars` as a plain plotly spec (for static HTML)."""
    title = "Op time, reference vs target"
    df = profile_frame(data)
    if df is None or df.empty:
        return _empty_spec(title, "No op profile: run the cell with %%neuron --profile.")
    df = df.assign(_key=df[["ref_time_s", "target_time_s"]].max(axis=1))
    df = df.sort_values(["_key", "op"], ascending=[False, True]).head(n).iloc[::-1]
    ops = list(df["op"])
    ref_kind, target_kind = op_time_kind(data["ref"]), op_time_kind(data["target"])
    colors = [FALLBACK_COLOR if fb else TARGET_COLOR for fb in df["fallback"]]
    spec: dict[str, Any] = {
        "data": [
            {"type": "bar", "name": f"{run_label_of(data, 'ref')} ({ref_kind})", "y": ops,
             "x": [float(v) * 1e3 for v in df["ref_time_s"]], "orientation": "h",
             "marker": {"color": REF_COLOR}, "customdata": [int(v) for v in df["ref_calls"]],
             "hovertemplate": "<b>%{y}</b><br>%{x:.3f} ms, %{customdata} calls<extra>ref</extra>"},
            {"type": "bar", "name": f"{run_label_of(data, 'target')} ({target_kind})", "y": ops,
             "x": [float(v) * 1e3 for v in df["target_time_s"]], "orientation": "h",
             "marker": {"color": colors}, "customdata": [int(v) for v in df["target_calls"]],
             "hovertemplate": "<b>%{y}</b><br>%{x:.3f} ms, %{customdata} calls"
                              "<extra>target</extra>"},
        ],
        "layout": {
            "barmode": "group",
            "bargap": 0.2,
            "xaxis": {
                "title": {"text": f"ms — ref: {ref_kind}; target: {target_kind} "
                                  "(red: CPU fallback)"}
            },
            "yaxis": {"automargin": True},
        },
    }  # fmt: skip
    return _layout_spec(spec, title, 160 + 30 * len(ops))


def memory_bars(data: dict[str, Any]) -> go.Figure:
    """Peak device memory and bytes allocated by ops, per backend (bytes where known)."""
    roles = [("ref", run_label_of(data, "ref")), ("target", run_label_of(data, "target"))]
    peaks, allocated, names, notes = [], [], [], []
    for role, label in roles:
        run = data.get(role, {})
        profile = run.get("profile") or {}
        peak = profile.get("peak_memory_bytes")
        if peak is None:
            peak = (run.get("memory") or {}).get("peak_bytes")
        names.append(label)
        peaks.append(peak)
        allocated.append(profile.get("bytes_allocated") if profile else None)
        notes.append("n/a" if peak is None else "")
    title = "Memory per backend"
    if all(p is None for p in peaks) and all(a is None for a in allocated):
        return _empty(title, "No memory statistics (the CPU keeps none; use --profile).")
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            name="peak device memory", x=names, y=[p or 0 for p in peaks],
            text=[format_bytes(p) for p in peaks], textposition="auto", marker_color=TARGET_COLOR,
        )
    )  # fmt: skip
    if any(a is not None for a in allocated):
        fig.add_trace(
            go.Bar(
                name="bytes allocated by ops (sum)", x=names, y=[a or 0 for a in allocated],
                text=[format_bytes(a) for a in allocated], textposition="auto",
                marker_color=REF_COLOR,
            )
        )  # fmt: skip
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="bytes")
    return _layout(fig, title, 300)


def call_sites(data: dict[str, Any], op: str) -> list[dict[str, Any]]:
    """Where ``op`` was called from: fallback event sites first, then the op profiles' first sites.

    Each entry has ``file``, ``line``, ``function``, ``module``, ``role`` and ``source``.
    """
    name = normalize_op(op)
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for event in data.get("target", {}).get("fallbacks", []):
        if normalize_op(event["op"]) != name:
            continue
        site = event.get("site") or {}
        key = (str(site.get("file", "")), int(site.get("line") or 0))
        if key in seen:
            continue
        seen.add(key)
        out.append(
            {"file": key[0], "line": key[1], "function": site.get("function", ""),
             "module": event.get("module", ""), "role": "target",
             "source": f"fallback ({event.get('phase', '')})"}
        )  # fmt: skip
    for role in ("ref", "target"):
        for row in (data.get(role, {}).get("profile") or {}).get("rows", []):
            if row.get("op") != name or not row.get("site"):
                continue
            site = row["site"]
            key = (str(site.get("file", "")), int(site.get("line") or 0))
            if key in seen:
                continue
            seen.add(key)
            out.append(
                {"file": key[0], "line": key[1], "function": site.get("function", ""),
                 "module": row.get("module", ""), "role": role, "source": "op profile (first call)"}
            )  # fmt: skip
    return out


def budget_histogram(data: dict[str, Any], path: str | None = None) -> go.Figure | None:
    """An output's error distribution: the target's against the reference's noise floor.

    Both are element-wise |run − oracle| (from a float64 oracle, or random rounding where the report
    says so), as counts per log10 bin; ``path`` defaults to the output with the largest R. None when
    no output has a measured distribution.
    """
    outputs = [o for o in (data.get("budget") or {}).get("outputs", []) if o.get("histogram")]
    if path is not None:
        outputs = [o for o in outputs if o["path"] == path]
    if not outputs:
        return None

    def ratio(output: dict[str, Any]) -> float:
        return float(output["ratio"])  # "inf" is stored as a string

    output = max(outputs, key=ratio)
    histogram = output["histogram"]
    edges = histogram["edges"]
    centers = [(a + b) / 2 for a, b in zip(edges, edges[1:], strict=False)]
    labels = [f"1e{c:.1f}" for c in centers]
    fig = go.Figure()
    for role, key, color in (("ref", "ref", REF_COLOR), ("target", "target", TARGET_COLOR)):
        fig.add_trace(
            go.Bar(
                name=f"{run_label_of(data, role)} − oracle", x=labels, y=histogram[key],
                marker_color=color, opacity=0.7,
                hovertemplate="|error| ≈ %{x}<br>%{y} elements<extra></extra>",
            )
        )  # fmt: skip
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text=f"|error| against the {output['source']} (log10 bins)")
    fig.update_yaxes(title_text="elements")
    title = f"Error distribution of {output['path']}: R {_factor(ratio(output))}, {output['label']}"
    return _layout(fig, title, 320)


def _factor(ratio: float) -> str:
    if ratio == float("inf"):
        return "inf"
    return f"{ratio:.1f}" if ratio < 10 else f"{ratio:.3g}"
