"""Result types of the scanner: :class:`Finding`, :class:`ScanReport` and :class:`Migration`.

They hold data only and render themselves (linter lines, an HTML table, a unified diff); no IPython
import is needed to build or render them.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.scan.rule import SEVERITY_ORDER, Severity

SCHEMA_VERSION = 1


class ScanSyntaxError(WorkbenchUsageError):
    """A file or cell could not be parsed as Python; the message names the file, cell and line.

    ``findings`` are those of the parts that parsed (a notebook's other cells), if any.
    """

    def __init__(self, message: str, findings: list[Finding] | None = None) -> None:
        super().__init__(message)
        self.findings = list(findings or [])


@dataclass(frozen=True)
class Finding:
    """One place in the source that needs attention before running on the target.

    Attributes
    ----------
    rule_id : str
        The rule that matched, e.g. ``"NW101"`` (see :data:`neuron_workbench.scan.RULES`).
    severity : {"info", "warning", "error"}
        The rule's severity.
    message : str
        What was found, specific to this place.
    suggestion : str
        The change to make.
    source : str
        The vendor fact behind the rule (notes section and vendor page).
    path : str
        File path, or ``"<cell>"`` for source text.
    line : int
        1-based line (within the cell for notebooks).
    col : int
        1-based column, in characters.
    cell : int or None
        1-based index among the notebook's code cells, or None outside notebooks.
    fixable : bool
        Whether ``migrate`` rewrites this finding.
    """

    rule_id: str
    severity: Severity
    message: str
    suggestion: str
    source: str
    path: str
    line: int
    col: int
    cell: int | None = None
    fixable: bool = False

    @property
    def location(self) -> str:
        """``path:line:col`` or ``path:cell N:line:col``."""
        cell = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{self.path}:{cell}{self.line}:{self.col}"

    def format(self, suggestion: bool = False) -> str:
        """Return the linter line ``path:line:col: RULE-ID message``.

        Parameters
        ----------
        suggestion : bool
            Append a second, indented line with the suggested change.

        Returns
        -------
        str
            One line, or two with ``suggestion=True``.
        """
        fix = " [*]" if self.fixable else ""
        text = f"{self.location}: {self.rule_id}{fix} {self.message}"
        if suggestion:
            text += f"\n    help: {self.suggestion}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """Return the finding as a JSON-serialisable dict."""
        return asdict(self)

    def sort_key(self) -> tuple[str, int, int, int, str]:
        """Order by path, cell, line, column, rule id."""
        return (self.path, self.cell or 0, self.line, self.col, self.rule_id)


def summarize(findings: Sequence[Finding]) -> dict[str, Any]:
    """Count findings by severity and rule.

    Parameters
    ----------
    findings : sequence of Finding
        The findings to count.

    Returns
    -------
    dict
        ``{"total", "error", "warning", "info", "fixable", "by_rule"}``.
    """
    by_severity = Counter(f.severity for f in findings)
    return {
        "total": len(findings),
        "error": by_severity.get("error", 0),
        "warning": by_severity.get("warning", 0),
        "info": by_severity.get("info", 0),
        "fixable": sum(f.fixable for f in findings),
        "by_rule": dict(sorted(Counter(f.rule_id for f in findings).items())),
    }


def summary_line(findings: Sequence[Finding]) -> str:
    """One deterministic line such as ``3 findings: 1 error, 1 warning, 1 info (1 fixable)``."""
    s = summarize(findings)
    if not s["total"]:
        return "no findings"
    noun = "finding" if s["total"] == 1 else "findings"
    parts = [
        f"{s['error']} error{'s' if s['error'] != 1 else ''}",
        f"{s['warning']} warning{'s' if s['warning'] != 1 else ''}",
        f"{s['info']} info",
    ]
    return f"{s['total']} {noun}: {', '.join(parts)} ({s['fixable']} fixable)"


@dataclass(frozen=True)
class ScanReport:
    """The findings of one scan, with a deterministic text and HTML rendering.

    Attributes
    ----------
    findings : tuple of Finding
        Sorted by location.
    target : str
        The target device the suggestions were written for (``"neuron"`` or ``"tpu"``).
    """

    findings: tuple[Finding, ...] = ()
    target: str = "neuron"

    def __len__(self) -> int:
        return len(self.findings)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __bool__(self) -> bool:
        # A report is truthy when it is clean, like a passing check.
        return not self.findings

    def at_least(self, severity: str) -> list[Finding]:
        """Return the findings whose severity is ``severity`` or worse."""
        floor = SEVERITY_ORDER[severity]
        return [f for f in self.findings if SEVERITY_ORDER[f.severity] >= floor]

    def summary(self) -> dict[str, Any]:
        """Counts by severity and rule (see :func:`summarize`)."""
        return summarize(self.findings)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document written by ``neuron-workbench scan --json``."""
        return {
            "schema_version": SCHEMA_VERSION,
            "target": self.target,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary(),
        }

    def to_text(self, suggestions: bool = True) -> str:
        """Linter lines, optionally each followed by its suggestion, then a summary line."""
        lines = [f.format(suggestion=suggestions) for f in self.findings]
        lines.append(summary_line(self.findings))
        return "\n".join(lines)

    def to_html(self) -> str:
        """An escaped HTML table of the findings."""
        if not self.findings:
            return "<p>neuron_scan: no findings</p>"
        head = "".join(
            f"<th>{h}</th>"
            for h in ("Location", "Rule", "Severity", "Message", "Suggestion", "Fix")
        )
        rows = []
        for f in self.findings:
            cells = (
                f.location,
                f.rule_id,
                f.severity,
                f.message,
                f.suggestion,
                "auto" if f.fixable else "",
            )
            tds = "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
            rows.append(f'<tr class="nw-{f.severity}" title="{html.escape(f.source)}">{tds}</tr>')
        caption = html.escape(summary_line(self.findings))
        return (
            f'<table class="neuron-scan"><caption>{caption}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )

    def __repr__(self) -> str:
        return f"<ScanReport {summary_line(self.findings)}>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.to_text(), "text/html": self.to_html()}


@dataclass(frozen=True)
class Migration:
    """The result of a mechanical migration.

    Attributes
    ----------
    path : str
        The migrated file, or ``"<cell>"``.
    old_source : str
        The input.
    new_source : str
        The input with every fixable finding rewritten.
    diff : str
        Unified diff from ``old_source`` to ``new_source``; empty when nothing changed.
    applied : list of Finding
        The findings that were rewritten.
    remaining : list of Finding
        Findings of the migrated source (what still needs a manual change).
    """

    path: str
    old_source: str
    new_source: str
    diff: str
    applied: list[Finding] = field(default_factory=list)
    remaining: list[Finding] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether the migration changed anything."""
        return self.new_source != self.old_source

    def to_text(self) -> str:
        """The diff (or ``no changes``) and a line counting rewrites and what is left."""
        body = self.diff.rstrip("\n") if self.changed else f"{self.path}: no changes"
        tail = f"{len(self.applied)} rewritten; remaining: {summary_line(self.remaining)}"
        return f"{body}\n{tail}"

    def __repr__(self) -> str:
        return f"<Migration {self.path}: {len(self.applied)} rewritten>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {
            "text/plain": self.to_text(),
            "text/html": f"<pre class='neuron-migrate'>{html.escape(self.to_text())}</pre>",
        }
