"""Reports: the verdict of a ``%%neuron`` cell and its HTML/JSON forms."""

from neuron_workbench.report.driver import CellComparison, CompareOptions, compare_cell
from neuron_workbench.report.html import render_page, render_report_html
from neuron_workbench.report.report import REPORT_MIME, SCHEMA_VERSION, Report

__all__ = [
    "CellComparison",
    "CompareOptions",
    "compare_cell",
    "REPORT_MIME",
    "SCHEMA_VERSION",
    "Report",
    "render_page",
    "render_report_html",
]
