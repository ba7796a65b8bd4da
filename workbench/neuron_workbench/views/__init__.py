"""Interactive and static views of reports: the only layer that imports plotly and ipywidgets.

- :class:`ReportView`: an ipywidgets ``Tab`` (Summary | Numerics | Layers | Ops | Fallbacks, plus
  Migration when the report has scanner findings) with Plotly ``FigureWidget`` charts;
- :func:`show_report`: what the magic calls after displaying a report;
- :mod:`neuron_workbench.views.figures`: plain ``go.Figure`` builders from report data.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["ReportView", "show_report", "widgets_can_render"]


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
