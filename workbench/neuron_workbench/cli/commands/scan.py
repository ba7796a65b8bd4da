"""``neuron-workbench scan PATH...``: report CUDA-only code, one finding per line, for CI.

Output follows the linters' convention, ``path:line:col: RULE-ID message`` (``path:cell N:line:col``
for notebooks), each followed by an indented ``help:`` line, then a summary. A file that cannot be
read or parsed is one ``neuron-workbench: error:`` line on stderr (and in the JSON's ``errors``);
the other files are still scanned. Exit codes: 0 when no finding is at or above ``--fail-on``
(default ``error``), 1 otherwise, 2 for usage or input errors (a file that could not be scanned).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.scan import RULES, SEVERITY_ORDER, TARGETS, ScanReport, scan_paths

NAME = "scan"
HELP = "Find CUDA-only code in .py files and notebooks (linter-style lines, exit codes for CI)."


def _rule_list(text: str) -> set[str]:
    ids = {part.strip().upper() for part in text.split(",") if part.strip()}
    unknown = sorted(ids - set(RULES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown rule id(s): {', '.join(unknown)}")
    return ids


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``scan`` options to its subparser."""
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="files or directories (directories recurse over *.py and *.ipynb)",
    )
    parser.add_argument(
        "--json",
        metavar="F",
        dest="json_path",
        help='also write the findings as JSON to F ("-" for stdout, which then '
        "replaces the text output)",
    )
    parser.add_argument(
        "--fail-on",
        choices=sorted(SEVERITY_ORDER, key=SEVERITY_ORDER.get),
        default="error",
        help="exit 1 when a finding has this severity or worse (default: error)",
    )
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="neuron",
        help="device the suggestions are written for (default: neuron)",
    )
    parser.add_argument(
        "--ignore",
        type=_rule_list,
        default=set(),
        metavar="IDS",
        help="comma-separated rule ids to leave out, e.g. NW191,NW120",
    )
    parser.add_argument(
        "--no-help",
        action="store_true",
        help="print only the finding lines, without the suggested change",
    )


def run(args: argparse.Namespace) -> int:
    """Scan, print, optionally write JSON, and return the exit code."""
    errors: list[str] = []
    found = scan_paths(args.paths, target=args.target, errors=errors)
    findings = [f for f in found if f.rule_id not in args.ignore]
    report = ScanReport(tuple(findings), args.target)
    document = report.to_dict()
    if errors:  # files left unscanned: a reader of the JSON must not take them for clean
        document["errors"] = list(errors)
    if args.json_path == "-":
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        sys.stdout.write(report.to_text(suggestions=not args.no_help) + "\n")
        if args.json_path:
            try:
                Path(args.json_path).write_text(
                    json.dumps(document, indent=2) + "\n", encoding="utf-8"
                )
            except OSError as exc:
                raise WorkbenchUsageError(f"cannot write {args.json_path}: {exc}") from None
    for error in errors:
        sys.stderr.write(f"neuron-workbench: error: {error}\n")
    if errors:
        return 2
    return 1 if report.at_least(args.fail_on) else 0
