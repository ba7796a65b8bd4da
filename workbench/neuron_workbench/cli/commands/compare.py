"""``neuron-workbench compare A B``: compare two recorded runs (artifacts) without executing anything."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

NAME = "compare"
HELP = (
    "Compare two run artifacts: A's reference run against B's target run "
    "(exit 0 pass, 1 fail or error, 3 --strict with fallbacks, 2 bad input)."
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options."""
    from neuron_workbench.cell.option_parsing import add_arguments
    from neuron_workbench.cell.options import COMPARE

    parser.add_argument("reference", help="artifact with the reference run (its 'ref' or only run)")
    parser.add_argument("target", help="artifact with the target run (its 'target' or only run)")
    parser.add_argument(
        "--ref-run",
        metavar="ROLE",
        help="A's run to use as the reference (default: its 'ref' or only run)",
    )
    parser.add_argument(
        "--target-run",
        metavar="ROLE",
        help="B's run to use as the target (default: its 'target' or only run); a recording of "
        "several targets (--target neuron,tpu) holds the others as target_<backend>",
    )
    add_arguments(parser, COMPARE)
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--html", metavar="FILE", help="write a standalone HTML report")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testcase)")


def pick_run(artifact: Any, role: str, *, exact: bool = False) -> Any:
    """``artifact``'s run in ``role``, else its only run; a usage error when ambiguous.

    ``exact``: the user named ``role`` (``--ref-run``, ``--target-run``), so only that run will do.
    """
    from neuron_workbench.artifacts import ArtifactError

    if role in artifact.runs:
        return artifact.runs[role]
    if len(artifact.runs) == 1 and not exact:
        return next(iter(artifact.runs.values()))
    raise ArtifactError(
        f"{artifact.path}: holds runs {', '.join(sorted(artifact.runs))} and none is {role!r}"
    )


def report_of_artifacts(
    ref_artifact: Any,
    target_artifact: Any,
    values: dict[str, Any] | None = None,
    *,
    ref_run: str | None = None,
    target_run: str | None = None,
) -> Any:
    """The :class:`~neuron_workbench.report.report.Report` of two artifacts' runs.

    ``values`` are option-table values by API name (tolerances) over the recorded cell's own;
    ``ref_run`` and ``target_run`` are the roles of the runs to compare; left out, ``ref`` and
    ``target`` (each artifact's only run where it holds one). A role given must be in its artifact:
    an only run of another role standing in for it would be compared under the wrong name.
    """
    from neuron_workbench.cell.session import compare_recorded

    roles = {"ref": ref_run, "target": target_run}

    def pick(artifact: Any, side: str) -> Any:
        role = roles[side]
        return pick_run(artifact, role or side, exact=role is not None)

    return compare_recorded(ref_artifact, target_artifact, values=values, pick=pick)


def other_targets(artifact: Any, compared: str) -> list[str]:
    """The target runs ``artifact`` holds besides ``compared`` (a recording of several targets)."""
    from neuron_workbench.artifacts import is_target_role

    return sorted(role for role in artifact.runs if role != compared and is_target_role(role))


def run(args: argparse.Namespace) -> int:
    """Load both artifacts, compare, print the verdict line, write the files; return the exit code."""
    from neuron_workbench.artifacts import load
    from neuron_workbench.cell.option_parsing import given_values
    from neuron_workbench.cell.options import COMPARE
    from neuron_workbench.cli.notebook_runner import (
        InputResult,
        check_distinct,
        check_writable,
        junit_xml,
        terminal_safe,
        write_text,
    )
    from neuron_workbench.compare.tolerances import check_pair
    from neuron_workbench.errors import WorkbenchUsageError
    from neuron_workbench.report.html import render_page

    values = given_values(args, COMPARE)
    check_pair(values.get("rtol"), values.get("atol"))
    for report_path in (args.json, args.html, args.junit):
        check_writable(report_path)
    reports = {"--json": args.json, "--html": args.html, "--junit": args.junit}
    check_distinct(reports, [args.reference, args.target])
    ref_artifact = load(args.reference)
    target_artifact = load(args.target)
    if (
        Path(args.reference).resolve() == Path(args.target).resolve()
        and len(ref_artifact.runs) == 1
    ):  # its one run would stand for both sides: a PASS that says nothing of any port
        raise WorkbenchUsageError(
            f"{args.reference} holds one run: comparing it with itself checks nothing; give the "
            "artifact of the other side as B"
        )
    target_role = args.target_run or "target"
    if (
        Path(args.reference).resolve() == Path(args.target).resolve()
        and (args.ref_run or "ref") == target_role
    ):
        raise WorkbenchUsageError(
            f"--ref-run and --target-run both name {target_role!r}: its run would stand for both "
            "sides"
        )
    report = report_of_artifacts(
        ref_artifact, target_artifact, values, ref_run=args.ref_run, target_run=args.target_run
    )
    others = other_targets(target_artifact, target_role)
    if others and target_role in target_artifact.runs:
        # a recording of several targets: the others are one option away, and the report says so
        note = (
            f"{Path(args.target).name} also holds the target run(s) {', '.join(others)}: "
            f"--target-run {others[0]} compares one"
        )
        report.notes.append(note)
        sys.stderr.write(terminal_safe(f"note: {note}") + "\n")
    for warning in report.warnings:
        sys.stderr.write(terminal_safe(f"warning: {warning}") + "\n")
    sys.stdout.write(terminal_safe(report.summary()) + "\n")
    data = report.to_dict()
    data["label"] = f"{Path(args.reference).name} vs {Path(args.target).name}"
    data["cell_index"] = 1
    data["artifacts"] = {"ref": str(args.reference), "target": str(args.target)}
    stdout = getattr(args, "report_stdout", None)  # the command's own, where a report names -
    if args.json:
        write_text(args.json, json.dumps(data, indent=2) + "\n", stdout)
    if args.html:
        write_text(
            args.html, render_page([data], title=f"neuron-workbench: {data['label']}"), stdout
        )
    if args.junit:
        write_text(args.junit, junit_xml(Path(args.target).name, [data]), stdout)
    result = InputResult(str(args.target), reports=[data], kind="artifacts", cells=1)
    from neuron_workbench.cli.commands.run import allowed_fallbacks

    allowed = allowed_fallbacks(values)
    code = result.exit_code(bool(values.get("strict")), allowed=allowed)
    if code == 3:  # which ops, as `run --strict` says: the exit code alone does not
        for line in result.fallback_violations(allowed):
            sys.stderr.write(terminal_safe(line) + "\n")
    return code
