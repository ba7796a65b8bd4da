"""``neuron-workbench run NOTEBOOK|SCRIPT``: run every ``%%neuron`` comparison headless, for CI.

A notebook executes in a real Jupyter kernel with the extension loaded; a ``.py`` script written for
CUDA runs as one ``%%neuron`` cell in this process (the CUDA remap applies). Exit codes: 0 all passed,
1 a comparison failed, compared nothing (verdict ``UNCOMPARED``) or a cell raised, 3 ``--strict`` and
ops fell back to CPU, 4 ``--strict-graph-breaks`` and ``torch.compile`` broke a graph on a target (one
line on stderr), 2 usage or input errors (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from neuron_workbench.errors import WorkbenchUsageError

NAME = "run"
#: ``run train.py [options] -- ARGS``: the script's own arguments follow ``--``.
SCRIPT_ARGS = True
HELP = (
    "Execute a notebook (in a real kernel) or a CUDA script with the workbench and report every "
    "%%neuron comparison (exit 0 pass, 1 fail or nothing compared, 3 --strict with fallbacks, "
    "4 --strict-graph-breaks with graph breaks, 2 bad input)."
)


def add_script_options(parser: argparse.ArgumentParser) -> None:
    """``--cwd`` (and the ``-- ARGS`` that :mod:`neuron_workbench.cli.main` splits off)."""
    parser.add_argument(
        "--cwd",
        metavar="DIR",
        help="a script's working folder during its runs (default: the script's own folder)",
    )
    parser.set_defaults(script_args=[])


def script_folder(args: argparse.Namespace) -> str | None:
    """``--cwd`` as an absolute folder; a one-line usage error when it is not one."""
    if args.cwd is None:
        return None
    folder = Path(args.cwd).resolve()
    if not folder.is_dir():
        raise WorkbenchUsageError(f"--cwd {args.cwd}: no such folder")
    return str(folder)


def add_tolerance_options(parser: argparse.ArgumentParser) -> None:
    """``--rtol`` and ``--atol`` (both or neither)."""
    parser.add_argument("--rtol", type=float, metavar="R", help="relative tolerance (with --atol)")
    parser.add_argument("--atol", type=float, metavar="A", help="absolute tolerance (with --rtol)")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options."""
    parser.add_argument(
        "path",
        help="the notebook (.ipynb) or script (.py) to run; a script's own arguments follow "
        "`--` (run train.py --target tpu -- --batch_size=8)",
    )
    add_script_options(parser)
    parser.add_argument("--ref", metavar="BACKEND", help="reference backend for every cell")
    parser.add_argument("--target", metavar="BACKEND", help="target backend for every cell")
    add_tolerance_options(parser)
    parser.add_argument("--seed", type=int, help="seed at the start of each run (default 0)")
    parser.add_argument(
        "--judge",
        choices=("tolerance", "budget"),  # compare.budget.JUDGES; the CLI parses without torch
        help="tolerance (default): fixed rtol/atol, a failing float output shows its error ratio R; "
        "budget: a float output passes when R is within the reference's precision budget",
    )
    parser.add_argument("--strict", action="store_true", help="exit 3 if any op fell back to CPU")
    parser.add_argument(
        "--strict-graph-breaks",
        action="store_true",
        help="exit 4 if torch.compile broke a graph on a target (the first break on stderr)",
    )
    parser.add_argument(
        "--compile-check",
        action="store_true",
        help="run each cell again with torch.compile off on both sides and report both verdicts",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        metavar="N",
        help="a script: stop both runs after N scalars (loss.item(), ...) from the first call "
        "site that makes one (compare the first N steps of a long job)",
    )
    parser.add_argument("--json", metavar="FILE", help="write every report as JSON")
    parser.add_argument("--html", metavar="FILE", help="write a standalone HTML report")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testcase per cell)")
    parser.add_argument(
        "--record",
        metavar="DIR",
        help="save each comparison's runs as artifacts in DIR (scripts; notebooks when the "
        "magic supports NeuronMagics.record_dir)",
    )
    parser.add_argument(
        "--against",
        metavar="PATH",
        help="take each reference from a recording instead of running it: an artifact for a "
        "script, or the folder `run NOTEBOOK --record DIR` wrote for a notebook",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=900,
        help="seconds per cell, or per target run of a script in a worker (default 900)",
    )
    parser.add_argument(
        "--executor",
        choices=("auto", "inprocess", "worker"),
        help="where target runs happen: worker (a child process per target), inprocess, or auto "
        "(default: worker for neuron and tpu)",
    )
    add_target_flags(parser)


def add_target_flags(parser: argparse.ArgumentParser) -> None:
    """``--list-fallbacks``, ``--track-per-op`` and ``--on``, as ``%%neuron`` takes them."""
    parser.add_argument(
        "--list-fallbacks",
        action="store_true",
        help="tpu target: run with the CPU fallback on and list every missing op in one run",
    )
    parser.add_argument(
        "--track-per-op",
        action="store_true",
        help="real neuron target: attribute every CPU fallback to its call (a synchronize per op)",
    )
    parser.add_argument(
        "--on",
        metavar="CLUSTER",
        help="run targets in Ray actors on this cluster: ray://HOST:PORT (needs "
        "neuron-workbench[ray]); the reference stays here",
    )


#: Verdicts the summary line always counts; any other verdict is counted when it occurs.
_ALWAYS_COUNTED = ("PASS", "FAIL", "ERROR")


def verdict_summary(counts: dict[str, int]) -> str:
    """``2 PASS, 1 FAIL, 0 ERROR`` (``, 1 UNCOMPARED`` when there are), in verdict order."""
    from neuron_workbench.report.display import VERDICTS

    shown = [v for v in VERDICTS if v in _ALWAYS_COUNTED or counts.get(v, 0)]
    shown += sorted(v for v in counts if v not in VERDICTS)  # a verdict of a newer workbench
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in shown)


def _notebook_supports_record_dir() -> bool:
    from neuron_workbench.magics.neuron import NeuronMagics

    return NeuronMagics.class_traits().get("record_dir") is not None


def run(args: argparse.Namespace) -> int:
    """Execute, print one verdict line per report, write the files; return the exit code."""
    from neuron_workbench.cli.notebook_runner import (
        junit_xml,
        run_document,
        run_notebook,
        run_script,
        terminal_message,
        terminal_progress,
        write_text,
    )
    from neuron_workbench.compare.tolerances import check_pair
    from neuron_workbench.report.html import render_page
    from neuron_workbench.report.session import resolve_executor

    check_pair(args.rtol, args.atol)
    cluster = ""
    if args.on:
        from neuron_workbench.run.ray_executor import parse_cluster

        cluster = parse_cluster(args.on)
    suffix = Path(args.path).suffix.lower()
    if suffix not in (".ipynb", ".py"):
        raise WorkbenchUsageError(f"{args.path}: expected a notebook (.ipynb) or a script (.py)")
    if args.timeout <= 0:
        raise WorkbenchUsageError("--timeout must be a positive number of seconds")
    against = Path(args.against).resolve() if args.against else None
    if against is not None and not against.exists():
        raise WorkbenchUsageError(f"no such recording: {args.against}")
    if suffix == ".ipynb" and against is not None and not against.is_dir():
        raise WorkbenchUsageError(
            f"{args.against}: for a notebook, --against takes the folder `run NOTEBOOK --record DIR` "
            "wrote (one artifact per %%neuron cell)"
        )
    if suffix == ".py" and against is not None and against.is_dir():
        against = against / f"{Path(args.path).stem}.nwrun.zip"
        if not against.is_file():
            raise WorkbenchUsageError(f"no recording of {Path(args.path).name} in {args.against}")
    if args.max_steps is not None and args.max_steps < 1:
        raise WorkbenchUsageError("--max-steps must be at least 1")
    if suffix == ".ipynb" and (args.script_args or args.cwd or args.max_steps):
        raise WorkbenchUsageError("`-- ARGS`, --cwd and --max-steps apply to a script (.py)")
    if suffix == ".ipynb":
        if args.record and not _notebook_supports_record_dir():
            raise WorkbenchUsageError(
                "--record for notebooks needs NeuronMagics.record_dir, which this version lacks"
            )
        result = run_notebook(
            args.path,
            ref=args.ref,
            target=args.target,
            rtol=args.rtol,
            atol=args.atol,
            seed=args.seed,
            timeout=args.timeout,
            progress=terminal_progress,
            record_dir=str(Path(args.record).resolve()) if args.record else None,
            executor=args.executor,
            against_dir=str(against) if against is not None else None,
            list_fallbacks=args.list_fallbacks,
            track_per_op=args.track_per_op,
            cluster=cluster,
            judge=args.judge,
            compile_check=args.compile_check,
        )
    else:
        result = run_script(
            args.path,
            args=args.script_args,
            cwd=script_folder(args),
            max_steps=args.max_steps,
            ref=args.ref,
            target=args.target,
            rtol=args.rtol,
            atol=args.atol,
            seed=args.seed if args.seed is not None else 0,
            progress=terminal_message,
            record_dir=args.record,
            against=str(against) if against is not None else None,
            executor=args.executor or "auto",
            # a hung target in a worker is ended after --timeout, like a hung notebook cell
            timeout=float(args.timeout)
            if cluster
            or resolve_executor(args.executor or "auto", [args.target or "neuron"]) == "worker"
            else None,
            list_fallbacks=args.list_fallbacks,
            track_per_op=args.track_per_op,
            cluster=cluster,
            judge=args.judge or "tolerance",
            compile_check=args.compile_check,
        )
        if result.script_exit is not None:  # argparse's usage error: the script's own message
            code, text = result.script_exit
            sys.stderr.write(text)
            return code
    for report in result.reports:
        sys.stdout.write(f"{report['label']}: {report['summary']}\n")
    for error in result.cell_errors:
        sys.stdout.write(
            f"cell {error['cell_index']}: raised {error['type']}: {error['message']}\n"
        )
    counts = result.verdict_counts()
    code = result.exit_code(args.strict, args.strict_graph_breaks)
    summary = (
        f"{len(result.reports)} reports: "
        + verdict_summary(counts)
        + f"; {result.fallback_reports()} with CPU fallbacks; {len(result.cell_errors)} cell errors"
    )
    sys.stdout.write(summary + "\n")
    if code == 4:
        sys.stderr.write(result.graph_break_violations()[0] + "\n")
    options: dict[str, Any] = {
        "ref": args.ref,
        "target": args.target,
        "rtol": args.rtol,
        "atol": args.atol,
        "seed": args.seed,
        "executor": args.executor,
        **({"list_fallbacks": True} if args.list_fallbacks else {}),
        **({"track_per_op": True} if args.track_per_op else {}),
        **({"judge": args.judge} if args.judge else {}),
        **({"on": cluster} if cluster else {}),
        **({"args": list(args.script_args)} if args.script_args else {}),
        **({"max_steps": args.max_steps} if args.max_steps is not None else {}),
        **({"compile_check": True} if args.compile_check else {}),
    }
    name = Path(result.path).name
    if args.json:
        document = run_document(
            result,
            strict=args.strict,
            options=options,
            strict_graph_breaks=args.strict_graph_breaks,
        )
        write_text(args.json, json.dumps(document, indent=2) + "\n")
    if args.html:
        write_text(args.html, render_page(result.reports, title=f"neuron-workbench: {name}"))
    if args.junit:
        write_text(args.junit, junit_xml(name, result.reports, result.cell_errors))
    return code
