"""``neuron-workbench run NOTEBOOK``: execute a notebook headless and report its ``%%neuron`` cells."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from neuron_workbench.cli.main import EXIT_FAILED, EXIT_FALLBACK, EXIT_OK
from neuron_workbench.errors import WorkbenchUsageError

NAME = "run"
HELP = "Execute a notebook headless with the workbench loaded and report every %%neuron cell."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options."""
    parser.add_argument("path", help="the notebook (.ipynb) to execute")
    parser.add_argument("--ref", metavar="BACKEND", help="reference backend for every cell")
    parser.add_argument("--target", metavar="BACKEND", help="target backend for every cell")
    parser.add_argument("--strict", action="store_true", help="exit 3 if any op fell back to CPU")
    parser.add_argument("--json", metavar="FILE", help="write every report as JSON")
    parser.add_argument("--html", metavar="FILE", help="write a standalone HTML report")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell (default 900)")


def _write(path: str, text: str) -> None:
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise WorkbenchUsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    """Execute, print one verdict line per report, write the files; return the exit code."""
    from neuron_workbench.cli.notebook_runner import run_notebook, terminal_progress
    from neuron_workbench.report.html import render_page

    if not args.path.endswith(".ipynb"):
        raise WorkbenchUsageError(f"{args.path}: expected a notebook (.ipynb)")
    result = run_notebook(
        args.path,
        ref=args.ref,
        target=args.target,
        timeout=args.timeout,
        progress=terminal_progress,
    )
    for report in result.reports:
        sys.stdout.write(f"{report['label']}: {report['summary']}\n")
    for error in result.cell_errors:
        sys.stdout.write(f"cell {error['cell_index']}: raised {error['type']}: {error['message']}\n")
    counts = result.verdict_counts()
    fallback_cells = sum(1 for r in result.reports if r.get("fallback_ops"))
    summary = (
        f"{len(result.reports)} reports: "
        + ", ".join(f"{counts.get(v, 0)} {v}" for v in ("PASS", "FAIL", "ERROR"))
        + f"; {fallback_cells} with CPU fallbacks; {len(result.cell_errors)} cell errors"
    )
    sys.stdout.write(summary + "\n")
    if args.json:
        payload = {
            "schema_version": 1,
            "notebook": result.path,
            "summary": {"verdicts": counts, "cell_errors": len(result.cell_errors)},
            "reports": result.reports,
            "cell_errors": result.cell_errors,
        }
        _write(args.json, json.dumps(payload, indent=2) + "\n")
    if args.html:
        _write(args.html, render_page(result.reports, title=f"neuron-workbench: {result.path}"))
    if args.strict and fallback_cells:
        return EXIT_FALLBACK
    failed = counts.get("FAIL", 0) + counts.get("ERROR", 0) + len(result.cell_errors)
    return EXIT_FAILED if failed else EXIT_OK
