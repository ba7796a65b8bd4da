"""Interactive and static views of reports: the only layer that imports plotly and ipywidgets.

- :func:`report_bundle`: the one display of a ``%%neuron`` report, a MIME bundle every front end
  picks its richest view from (see there);
- :class:`ReportView`: an ipywidgets ``Tab`` (Summary | Numerics | Layers | Ops | Fallbacks, plus
  Compile when a run used ``torch.compile`` and Migration when the report has scanner findings)
  with Plotly ``FigureWidget`` charts;
- :func:`show_report`: display the widget alone;
- :mod:`neuron_workbench.views.figures`: plain ``go.Figure`` builders from report data;
  :mod:`neuron_workbench.views.compile_figures`: the compile vs run time per graph chart;
  :mod:`neuron_workbench.views.scalar_figures`: loss curves by call site.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "WIDGET_VIEW_MIME",
    "ReportView",
    "close_cell_views",
    "report_bundle",
    "show_report",
    "widgets_can_render",
]

#: MIME type of an ipywidgets view in a display bundle.
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"


def __getattr__(name: str) -> Any:
    # plotly and ipywidgets load only when a view is actually made.
    if name == "ReportView":
        from neuron_workbench.views.widget import ReportView

        return ReportView
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def widgets_can_render() -> bool:
    """True inside a Jupyter kernel (a frontend can show widgets); False in plain IPython/Python."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show_report(report: Any) -> None:
    """Display the best view of ``report`` for this environment.

    In a Jupyter kernel that is the :class:`ReportView` widget (its display bundle also carries
    static charts for renderers without a kernel). Elsewhere nothing extra is shown: the report's
    own text and HTML have already been displayed. A view that fails to build never breaks the
    cell; the failure is reported on one line of stderr.

    Parameters
    ----------
    report : Report or dict
        The report, or its ``to_dict()`` data.
    """
    if not widgets_can_render():
        return
    try:
        from IPython.display import display

        from neuron_workbench.views.widget import ReportView

        display(ReportView(report))
    except Exception as exc:  # the report itself is already on screen
        sys.stderr.write(
            f"neuron-workbench: report view unavailable: {type(exc).__name__}: {exc}\n"
        )


#: The report views each notebook cell (by its front end's cell id) showed last: running a cell
#: again replaces its output, and the views it showed before are closed
#: (:func:`close_cell_views`); otherwise every run of a cell kept two dozen widgets, and the report
#: data they hold, for the rest of the session.
_CELL_VIEWS: dict[str, list[Any]] = {}


def close_cell_views(cell_id: str | None) -> None:
    """Close the report views an earlier run of the cell ``cell_id`` showed.

    Parameters
    ----------
    cell_id : str or None
        The front end's id of the cell (JupyterLab, Notebook 7 and VS Code send one with each
        execution); None, as from a terminal shell or a front end that sends none: nothing is
        closed.
    """
    for view in _CELL_VIEWS.pop(cell_id, []) if cell_id else ():
        try:
            view.close()
        except Exception:  # noqa: BLE001 - an old view that cannot close never fails the new cell
            pass


def report_bundle(
    report: Any, *, widget: str = "auto", cell_id: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The MIME bundle (data, metadata) of one report: one display, each front end picks a view.

    The bundle carries, for ``widget="auto"``:

    - ``application/vnd.neuron-workbench.report+json``, the report's data: JupyterLab with the
      neuron-workbench-lab extension draws it natively (Plotly charts, click-to-source), also after
      a reload without a kernel. That renderer's rank (-20) is ahead of the widget manager's (-10),
      so JupyterLab shows this one view and never the widget as well;
    - ``application/vnd.jupyter.widget-view+json``, the :class:`ReportView` (only in a kernel,
      where a front end can talk to it): classic Notebook, VS Code, Colab and JupyterLab without
      the extension show it;
    - ``text/html``: the report's HTML plus static Plotly charts (plotly.js from its CDN) for
      nbconvert and previews; nbconvert passes over the widget view when the notebook stores no
      widget state;
    - ``text/plain``: the one-line verdict.

    ``widget="force"`` (``%%neuron --widget``) leaves the report's data out of ``data`` and puts it
    in ``metadata`` instead, so every front end shows the widget (and the extension's porting
    dashboard still finds the report). ``widget="none"`` leaves the widget out.

    Parameters
    ----------
    report : Report or dict
        The report, or its ``to_dict()`` data.
    widget : {"auto", "force", "none"}
        Whether the widget view is in the bundle, and whether it must win.
    cell_id : str, optional
        The front end's id of the cell the bundle is shown in: its view is closed when the cell
        runs again (:func:`close_cell_views`).

    Returns
    -------
    data, metadata : dict
        For ``IPython.display.display(data, metadata=metadata, raw=True)``.
    """
    from neuron_workbench.report.html import render_report_html
    from neuron_workbench.report.report import REPORT_MIME

    if widget not in ("auto", "force", "none"):
        raise ValueError(f"widget must be 'auto', 'force' or 'none', not {widget!r}")
    to_dict = getattr(report, "to_dict", None)
    data_dict = to_dict() if to_dict is not None else dict(report)
    html = render_report_html(data_dict)
    try:
        from neuron_workbench.views.widget import static_html

        html += static_html(data_dict)
    except Exception as exc:  # the charts are an extra; the report's own HTML stands alone
        sys.stderr.write(
            f"neuron-workbench: static charts unavailable: {type(exc).__name__}: {exc}\n"
        )
    data: dict[str, Any] = {"text/plain": str(data_dict.get("summary", "")), "text/html": html}
    metadata: dict[str, Any] = {}
    if widget == "force":
        metadata[REPORT_MIME] = data_dict
    else:
        data[REPORT_MIME] = data_dict
    if widget != "none" and widgets_can_render():
        try:
            from neuron_workbench.views.widget import ReportView

            view = ReportView(data_dict)
            data[WIDGET_VIEW_MIME] = view.model_view_data()
            if cell_id:
                _CELL_VIEWS.setdefault(cell_id, []).append(view)
        except Exception as exc:  # the other views are in the bundle already
            sys.stderr.write(
                f"neuron-workbench: report view unavailable: {type(exc).__name__}: {exc}\n"
            )
    return data, metadata
