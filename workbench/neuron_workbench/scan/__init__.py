"""Migration scanner: find CUDA-only code, explain each finding, rewrite the safe ones.

>>> from neuron_workbench.scan import scan_source
>>> [f.rule_id for f in scan_source('x = torch.zeros(2, device="cuda")')]
['NW101']

The rules are in :data:`RULES` (ids are stable; see ``README.md`` in this folder); the devices
suggestions can be written for are in :data:`TARGETS`. Parsing uses the standard :mod:`ast`
module, rewriting uses libcst; nothing here imports torch or IPython.
"""

from __future__ import annotations

from collections.abc import Mapping

from neuron_workbench.scan.api import (
    iter_source_files,
    migrate_path,
    migrate_source,
    scan_path,
    scan_paths,
    scan_source,
    unified_diff,
)
from neuron_workbench.scan.checks import TARGETS
from neuron_workbench.scan.findings import (
    SCHEMA_VERSION,
    Finding,
    Migration,
    ScanReport,
    ScanSyntaxError,
    summarize,
    summary_line,
)
from neuron_workbench.scan.rules import RULES, SEVERITY_ORDER, Rule, get_rule

__all__ = [
    "RULES",
    "SCHEMA_VERSION",
    "SEVERITY_ORDER",
    "TARGETS",
    "Finding",
    "Migration",
    "Rule",
    "ScanReport",
    "ScanSyntaxError",
    "get_rule",
    "iter_source_files",
    "migrate_path",
    "migrate_source",
    "scan_cell",
    "scan_path",
    "scan_paths",
    "scan_source",
    "summarize",
    "summary_line",
    "unified_diff",
]


def scan_cell(
    source: str, *, target: str = "neuron", imports: Mapping[str, str] | None = None
) -> ScanReport:
    """Scan one notebook cell and return a renderable report (for the ``%%neuron`` Migration tab).

    Parameters
    ----------
    source : str
        The cell body (IPython syntax is accepted).
    target : {"neuron", "tpu"}
        The device the suggestions are written for.
    imports : mapping of str to str, optional
        Modules earlier cells imported, by the name the cell uses (``{"nn": "torch.nn"}``).

    Returns
    -------
    ScanReport
        Empty (and truthy) when the cell is clean or does not parse: a cell that fails to parse
        is reported by the run itself, not by the Migration tab.
    """
    try:
        findings = scan_source(source, "<cell>", target=target, ipython=True, imports=imports)
    except ScanSyntaxError:
        findings = []
    return ScanReport(tuple(findings), target)
