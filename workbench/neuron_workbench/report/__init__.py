"""Reports: the verdict of a ``%%neuron`` cell and its HTML/JSON forms."""

from neuron_workbench.report.html import render_page, render_report_html
from neuron_workbench.report.report import REPORT_MIME, Report
from neuron_workbench.report.schema import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION, read_report

__all__ = [
    "READABLE_SCHEMA_VERSIONS",
    "REPORT_MIME",
    "SCHEMA_VERSION",
    "Report",
    "read_report",
    "render_page",
    "render_report_html",
]
