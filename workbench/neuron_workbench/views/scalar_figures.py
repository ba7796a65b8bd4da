"""Plotly figures of the scalars a cell materialised (``loss.item()``), by call site: loss curves.

Built from ``Report.to_dict()`` data, in the style of :mod:`neuron_workbench.views.figures`.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from neuron_workbench.views.figure_style import (
    FALLBACK_COLOR,
    GRID,
    REF_COLOR,
    TARGET_COLOR,
    page_layout,
    run_label_of,
)

__all__ = ["MAX_SCALAR_CHARTS", "scalar_curves", "scalar_curves_specs"]

MAX_SCALAR_CHARTS = 8


def _number(value: Any) -> float | None:
    """A charted value: finite numbers as they are, NaN/inf (JSON strings) as gaps."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def scalar_curves_specs(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per call site, both runs' observed scalars overlaid, and ``|Δ|`` below (plain specs).

    One chart per site whose values are numbers (a loss, an accuracy), in the order the sites
    were first seen, at most :data:`MAX_SCALAR_CHARTS`. Where the runs part, a marker shows the
    first divergence. Empty when the report has no observed scalars.
    """
    scalars = data.get("scalars") or {}
    first = scalars.get("first") or {}
    specs = []
    for site in scalars.get("sites") or []:
        ref = [_number(v) for v in site.get("ref", [])]
        target = [_number(v) for v in site.get("target", [])]
        if not any(v is not None for v in ref + target):
            continue  # .tolist() of several numbers: in the data, not charted
        steps = list(range(1, max(len(ref), len(target)) + 1))
        diff = [_number(v) for v in site.get("abs_diff", [])]
        name = str(site.get("site", ""))
        traces: list[dict[str, Any]] = [
            {
                "type": "scatter",
                "mode": "lines+markers" if len(steps) <= 60 else "lines",
                "name": run_label_of(data, "ref"),
                "x": steps[: len(ref)],
                "y": ref,
                "line": {"color": REF_COLOR},
                "xaxis": "x",
                "yaxis": "y",
            },
            {
                "type": "scatter",
                "mode": "lines+markers" if len(steps) <= 60 else "lines",
                "name": run_label_of(data, "target"),
                "x": steps[: len(target)],
                "y": target,
                "line": {"color": TARGET_COLOR, "dash": "dot"},
                "xaxis": "x",
                "yaxis": "y",
            },
            {
                "type": "bar",
                "name": "|Δ|",
                "x": steps[: len(diff)],
                "y": diff,
                "marker": {"color": FALLBACK_COLOR},
                "opacity": 0.6,
                "xaxis": "x2",
                "yaxis": "y2",
                "showlegend": False,
            },
        ]
        parts_at = site.get("parts_at")
        title = f"Observed scalars at {name} ({site.get('how', '')}, {site.get('dtype')})"
        if parts_at is not None:
            title += f": part at #{parts_at}"
            if first.get("site") == name:
                title += " (first divergence)"
            at = _number(target[parts_at - 1]) if parts_at <= len(target) else None
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": "first difference",
                    "x": [parts_at],
                    "y": [at if at is not None else ref[parts_at - 1]]
                    if parts_at <= len(ref) or at is not None
                    else [None],
                    "marker": {"color": FALLBACK_COLOR, "symbol": "x", "size": 11},
                    "xaxis": "x",
                    "yaxis": "y",
                }
            )
        else:
            title += ": match"
        layout = page_layout(title, 380)
        layout.update(
            {
                "xaxis": {"anchor": "y", "showticklabels": False, "matches": "x2", **GRID},
                "yaxis": {"domain": [0.36, 1.0], "title": {"text": "value"}, **GRID},
                "xaxis2": {"anchor": "y2", "title": {"text": "occurrence (step)"}, **GRID},
                "yaxis2": {
                    "domain": [0.0, 0.26],
                    "title": {"text": "|Δ|"},
                    "rangemode": "nonnegative",
                    "exponentformat": "e",
                    **GRID,
                },
                "legend": {"orientation": "h", "y": -0.25},
                "margin": {"l": 10, "r": 10, "t": 60, "b": 60},
            }
        )
        specs.append({"data": traces, "layout": layout})
        if len(specs) >= MAX_SCALAR_CHARTS:
            break
    return specs


def scalar_curves(data: dict[str, Any]) -> list[go.Figure]:
    """:func:`scalar_curves_specs` as figures (for the widget)."""
    return [go.Figure(spec) for spec in scalar_curves_specs(data)]
