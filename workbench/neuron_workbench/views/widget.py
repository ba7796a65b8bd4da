"""``ReportView``: an ipywidgets Tab (Summary | Numerics | Layers | Ops | Fallbacks) of one report.

A cell that ran ``torch.compile`` also gets a Compile tab, and one with scanner findings a Migration
tab.

Built from ``Report.to_dict()`` data only, so a saved report renders the same. Tabs are filled when
first selected (each Plotly ``FigureWidget`` carries the plotly.js bundle to the browser, so only
the visible ones are made). Clicking an op's bar shows the lines that called it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs_version
from plotly.utils import PlotlyJSONEncoder

from neuron_workbench.report.schema import read_report
from neuron_workbench.views import compile_figures, figures, scalar_figures, tables

__all__ = ["TAB_TITLES", "ReportView", "report_data", "static_html"]

#: Tab titles, in order (``Compile`` is added when a run compiled, then ``Migration`` when the
#: report has scanner findings).
TAB_TITLES = ("Summary", "Numerics", "Layers", "Ops", "Fallbacks")


def report_data(report_or_dict: Any) -> dict[str, Any]:
    """The report's JSON data from a ``Report`` (``to_dict()``) or the data itself.

    Data of an earlier ``schema_version`` is brought to the current one
    (:func:`~neuron_workbench.report.schema.read_report`).
    """
    if isinstance(report_or_dict, dict):
        return read_report(report_or_dict)
    to_dict = getattr(report_or_dict, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"expected a Report or its to_dict() data, got {type(report_or_dict)!r}")
    return to_dict()


class ReportView(W.Tab):
    """Tabbed, interactive view of one ``%%neuron`` report.

    Parameters
    ----------
    report_or_dict : Report or dict
        The report, or its ``to_dict()`` data (e.g. loaded from a saved JSON file).

    Attributes
    ----------
    data : dict
        The report data everything is built from.
    figures : dict of str to go.FigureWidget
        The figures built so far: ``op_time`` and ``memory`` (Ops tab), ``fallback_bar`` and
        ``treemap`` (Fallbacks tab), ``compile_time`` (Compile tab).
    sites : dict of str to ipywidgets.HTML
        The call-site panes of the Ops and Fallbacks tabs (filled by :meth:`show_call_sites`).
    """

    def __init__(self, report_or_dict: Any, **kwargs: Any) -> None:
        data = report_data(report_or_dict)
        titles = list(TAB_TITLES)
        builders: list[Callable[[], list[W.Widget]]] = [
            self._summary, self._numerics, self._layers, self._ops, self._fallbacks,
        ]  # fmt: skip
        if tables.compiled_runs(data):
            titles.append("Compile")
            builders.append(self._compile)
        if data.get("migration"):
            titles.append("Migration")
            builders.append(self._migration)
        children = [W.VBox(layout=W.Layout(padding="6px")) for _ in titles]
        super().__init__(children=children, titles=titles, **kwargs)
        self.data = data
        self.figures: dict[str, go.FigureWidget] = {}
        self.sites = {"ops": W.HTML(), "fallbacks": W.HTML()}
        self.selected_op: str | None = None
        self._builders = builders
        self._built: set[int] = set()
        self.add_class("nw-report-view")
        self.observe(self._on_select, names="selected_index")
        self.selected_index = 0
        self._build(0)

    def close(self) -> None:
        """Close the view and every widget it made (tabs, panes, figures, their layouts).

        ``Widget.close`` closes one widget: the two dozen this view is made of, and the report
        data they hold, would stay in the kernel for the rest of the session.
        """
        # (also called by Widget.__del__, on a view whose __init__ may have failed part way)
        figures, sites = getattr(self, "figures", {}), getattr(self, "sites", {})
        for widget in (*figures.values(), *sites.values(), *getattr(self, "children", ())):
            _close_tree(widget)
        figures.clear()
        for part in (getattr(self, "layout", None), getattr(self, "style", None)):
            if isinstance(part, W.Widget):
                part.close()
        super().close()

    # -- tabs ----------------------------------------------------------------------------------
    def _on_select(self, change: dict[str, Any]) -> None:
        index = change.get("new")
        if index is not None:
            self._build(int(index))

    def _build(self, index: int) -> None:
        if index in self._built or not 0 <= index < len(self._builders):
            return
        self._built.add(index)
        self.children[index].children = tuple(self._builders[index]())

    def build_all(self) -> ReportView:
        """Fill every tab now (they are otherwise filled on first selection); returns self."""
        for index in range(len(self._builders)):
            self._build(index)
        return self

    def _html(self, body: str) -> W.HTML:
        return W.HTML(tables.STYLE + body, layout=W.Layout(width="100%", overflow="auto"))

    def _figure(self, key: str, fig: go.Figure) -> go.FigureWidget:
        widget = go.FigureWidget(fig)
        self.figures[key] = widget
        return widget

    def _summary(self) -> list[W.Widget]:
        # HTML only: the summary is shown first, and a FigureWidget costs every cell time.
        return [self._html(tables.summary_html(self.data))]

    def _numerics(self) -> list[W.Widget]:
        widgets: list[W.Widget] = [self._html(tables.numerics_html(self.data))]
        measured = tables.measurements_html(self.data)
        if measured:
            widgets.append(self._html(measured))
        curves = figures.loss_curves(self.data)
        if curves is not None:
            widgets.append(self._figure("loss_curves", curves))
        for index, scalar_fig in enumerate(scalar_figures.scalar_curves(self.data)):
            widgets.append(self._figure(f"scalars_{index}", scalar_fig))
        budget = figures.budget_histogram(self.data)
        if budget is not None:
            widgets.append(self._figure("budget", budget))
        return widgets

    def _layers(self) -> list[W.Widget]:
        widgets: list[W.Widget] = [self._html(tables.layers_html(self.data))]
        chart = figures.layer_errors(self.data)
        if chart is not None:
            widgets.append(self._figure("layer_errors", chart))
        return widgets

    def _ops(self) -> list[W.Widget]:
        widgets: list[W.Widget] = [self._html(tables.ops_html(self.data))]
        if figures.profile_frame(self.data) is not None:
            fig = self._figure("op_time", figures.op_time_bars(self.data))
            self._on_bar_click(fig, "ops")
            widgets[:0] = [fig, self.sites["ops"]]
        widgets.append(self._figure("memory", figures.memory_bars(self.data)))
        return widgets

    def _fallbacks(self) -> list[W.Widget]:
        widgets: list[W.Widget] = [self._html(tables.fallbacks_html(self.data))]
        if self.data.get("target", {}).get("fallbacks"):
            bar = self._figure("fallback_bar", figures.fallback_bar(self.data))
            self._on_bar_click(bar, "fallbacks")
            widgets += [
                bar,
                self.sites["fallbacks"],
                self._figure("treemap", figures.module_treemap(self.data)),
            ]
        return widgets

    def _compile(self) -> list[W.Widget]:
        widgets: list[W.Widget] = [self._html(tables.compile_html(self.data))]
        chart = compile_figures.compile_time_figure(self.data)
        if chart is not None:
            widgets.insert(0, self._figure("compile_time", chart))
        return widgets

    def _migration(self) -> list[W.Widget]:
        return [self._html(tables.migration_html(self.data))]

    # -- interaction ---------------------------------------------------------------------------
    def _on_bar_click(self, fig: go.FigureWidget, pane: str) -> None:
        def clicked(trace: Any, points: Any, state: Any) -> None:
            if points.point_inds:
                self.show_call_sites(str(trace.y[points.point_inds[0]]), pane)

        for trace in fig.data:
            trace.on_click(clicked)
        self.sites[pane].value = (
            tables.STYLE
            + '<div class="nw-view note">Click a bar to see where the op is called.</div>'
        )

    def show_call_sites(self, op: str, pane: str = "fallbacks") -> None:
        """Show the source lines that called ``op`` in the ``ops`` or ``fallbacks`` pane."""
        self.selected_op = op
        self.sites[pane].value = tables.STYLE + tables.sites_html(
            op, figures.call_sites(self.data, op)
        )

    # -- static fallback -----------------------------------------------------------------------
    def model_view_data(self) -> dict[str, Any]:
        """The ``application/vnd.jupyter.widget-view+json`` data that shows this view."""
        return {"version_major": 2, "version_minor": 0, "model_id": self.model_id}

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        bundle["text/plain"] = str(self.data.get("summary", ""))
        bundle["text/html"] = static_html(self.data)
        return bundle


def _close_tree(widget: Any) -> None:
    """Close ``widget``, the widgets it contains and its layout and style widgets."""
    for child in getattr(widget, "children", None) or ():
        _close_tree(child)
    for part in (getattr(widget, "layout", None), getattr(widget, "style", None)):
        if isinstance(part, W.Widget):
            part.close()
    if isinstance(widget, W.Widget):
        widget.close()


def _static_figures(data: dict[str, Any]) -> list[dict[str, Any]]:
    # Only the charts that carry information the report's own HTML tables do not show well, as
    # plain specs: figure objects would cost milliseconds of validation on every displayed cell.
    out = []
    if data.get("target", {}).get("fallbacks"):
        out.append(figures.fallback_bar_spec(data))
    if figures.profile_frame(data) is not None:
        out.append(figures.op_time_bars_spec(data))
    budget = figures.budget_histogram(data)  # built only when the budget measured something
    if budget is not None:
        out.append(budget.to_plotly_json())
    out.extend(scalar_figures.scalar_curves_specs(data))  # loss curves by call site, both runs
    compiled = compile_figures.compile_time_spec(data)  # the report's HTML has the tables
    if compiled is not None:
        out.append(compiled)
    return out


def _plot_html(fig: go.Figure | dict[str, Any], div_id: str) -> str:
    """One figure as a div and a ``Plotly.newPlot`` call (plotly.js loaded once by the caller).

    Written by hand rather than with ``plotly.io.to_html``: that costs ~10 ms per figure on every
    cell and embeds the whole default template (~7 KB) in each; the figures are styled by hand.
    """
    spec = dict(fig) if isinstance(fig, dict) else fig.to_plotly_json()
    spec["layout"] = {k: v for k, v in spec.get("layout", {}).items() if k != "template"}
    height = int(spec["layout"].get("height") or 360)

    def js(value: Any) -> str:
        # inside <script>: "</" must not end the element early
        return json.dumps(value, cls=PlotlyJSONEncoder, separators=(",", ":")).replace("</", "<\\/")

    return (
        f'<div id="{div_id}" class="plotly-graph-div" style="height:{height}px;width:100%"></div>'
        '<script type="text/javascript">'
        f'if(window.Plotly&&document.getElementById("{div_id}")){{Plotly.newPlot("{div_id}",'
        f"{js(spec['data'])},{js(spec['layout'])},{js({'displaylogo': False})})}}</script>"
    )


def static_html(data: dict[str, Any]) -> str:
    """The charts (plotly.js from its CDN) and the op table, for nbconvert HTML and previews.

    This is what renderers without the extension or a live kernel show; the report's own HTML
    (verdict, outputs, fallback table) comes before it in the same display. Div ids are derived
    from the data, so re-rendering the same report gives the same HTML.
    """
    # Two cells with the same source and verdict still differ in options and timings; a page
    # holding both must not get one div id twice.
    identity = [data.get("summary", ""), data.get("cell", {}), data.get("options", {})]
    identity += [(data.get(role) or {}).get("wall_time_s") for role in ("ref", "target")]
    digest = hashlib.sha256(json.dumps(identity, default=str).encode()).hexdigest()[:12]
    parts = [tables.STYLE, '<div class="nw-view nw-static">']
    charts = _static_figures(data)
    if charts:
        parts.append(
            f'<script charset="utf-8" src="https://cdn.plot.ly/plotly-{get_plotlyjs_version()}'
            '.min.js"></script>'
        )
    for index, fig in enumerate(charts):
        parts.append(_plot_html(fig, f"nw-{digest}-{index}"))
    if figures.profile_frame(data) is not None:
        parts.append(tables.ops_html(data, n=15))
    parts.append("</div>")
    return "".join(parts)
