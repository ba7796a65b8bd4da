"""``neuron-workbench run NOTEBOOK|SCRIPT``: run every ``%%neuron`` comparison headless, for CI.

A notebook executes in a real Jupyter kernel with the extension loaded; a ``.py`` script written for
CUDA runs as one ``%%neuron`` cell in this process (the CUDA remap applies), and what it printed
(the kept run's output, as the magic shows a cell's) is shown before its report line. Exit codes:
0 all passed, 1 a comparison failed, compared nothing (verdict ``UNCOMPARED``) or a cell raised,
3 ``--strict`` and ops fell back to CPU, 4 ``--strict-graph-breaks`` and torch.compile broke a graph
on a target, 2 usage or input errors (one line on stderr). Every cell option of the option table
(:mod:`neuron_workbench.cell.options`) is a flag here, as in ``%%neuron``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Iterable
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
    """``--cwd``, ``--quiet`` (and the ``-- ARGS`` that :mod:`neuron_workbench.cli.main` splits off)."""
    parser.add_argument(
        "--cwd",
        metavar="DIR",
        help="a script's working folder during its runs (default: the script's own folder)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="do not show what a script prints (its training log): only the command's own lines",
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


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options: every cell option of the table, and run's own."""
    from neuron_workbench.cell.option_parsing import add_arguments
    from neuron_workbench.cell.options import RUN

    parser.add_argument(
        "path",
        help="the notebook (.ipynb) or script (.py) to run; a script's own arguments follow "
        "`--` (run train.py --target tpu -- --batch_size=8)",
    )
    add_script_options(parser)
    add_arguments(parser, RUN)
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


#: Options ``run`` applies to a notebook's reports itself rather than to its cells.
_JUDGED_FROM_REPORTS = ("strict", "strict_graph_breaks", "allow_fallback")


def allowed_fallbacks(values: dict[str, Any]) -> tuple[str, ...]:
    """The ops ``allow_fallback`` exempts from strict mode (``sort,topk`` and repeated flags)."""
    from neuron_workbench.cell.settings import split_ops

    return split_ops(values.get("allow_fallback", ()))


#: Verdicts the summary line always counts; any other verdict is counted when it occurs.
_ALWAYS_COUNTED = ("PASS", "FAIL", "ERROR")


def verdict_summary(counts: dict[str, int]) -> str:
    """``2 PASS, 1 FAIL, 0 ERROR`` (``, 1 UNCOMPARED`` when there are), in verdict order."""
    from neuron_workbench.report.display import VERDICTS

    shown = [v for v in VERDICTS if v in _ALWAYS_COUNTED or counts.get(v, 0)]
    shown += sorted(v for v in counts if v not in VERDICTS)  # a verdict of a newer workbench
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in shown)


def show_printed(stdout: str, stderr: str, shown: bool = False) -> None:
    """Show what a script printed, each stream on its own, before the lines the command adds.

    The script's text is shown as it was printed (its progress bars and colours too); a last line
    without its newline gets one, so the report line that follows starts a line of its own.

    Parameters
    ----------
    stdout, stderr : str
        The kept run's captured standard output and standard error.
    shown : bool, optional
        The text was shown as the script printed it: only the missing newlines are added.
    """
    for stream, text in ((sys.stdout, stdout), (sys.stderr, stderr)):
        if text:
            if not shown:
                stream.write(text)
            if not text.endswith("\n"):
                stream.write("\n")
            stream.flush()  # in order with the other stream where both are one terminal


_MISSING_FILE = re.compile(r"No such file or directory: '(?P<path>[^']+)'$")


def cwd_hint(script: str, errors: Iterable[tuple[str, str]]) -> str | None:
    """A hint when a script run from its own folder missed a file that is where the command runs.

    ``python scripts/train.py --config configs/a.json`` from a repository's root finds the config;
    the runs start in ``scripts/`` (as documented), so they raise ``FileNotFoundError`` with no word
    of ``--cwd``.

    Parameters
    ----------
    script : str
        The script as the command line named it.
    errors : iterable of (str, str)
        Each run's error type and message.

    Returns
    -------
    str or None
        The hint, or None when no error was a relative path found from the current folder.
    """
    folder = Path(script).resolve().parent
    if folder == Path.cwd().resolve():
        return None
    for kind, message in errors:
        found = _MISSING_FILE.search(message) if kind == "FileNotFoundError" else None
        if found is None or Path(found["path"]).is_absolute():
            continue
        missing = found["path"]
        if Path(missing).exists() and not (folder / missing).exists():
            return (
                f"hint: {Path(script).name} runs from its own folder ({folder}), which has no "
                f"{missing}; this folder has it: add --cwd . to run the script from here, as "
                "python would"
            )
    return None


def _notebook_supports_record_dir() -> bool:
    from neuron_workbench.magics.neuron import NeuronMagics

    return NeuronMagics.class_traits().get("record_dir") is not None


def _launch_workers_ahead(values: dict[str, Any]) -> None:
    """Launch the workers of the targets ``values`` name (or their defaults), not waiting for them.

    Before anything imports torch here: a script's run then waits for neither process's import
    after the other's. Nothing for a target that runs in this process or on a Ray cluster.
    """
    from neuron_workbench.cell.options import OPTIONS
    from neuron_workbench.worker_launch import launch_ahead

    resolved = {
        option.name: values.get(option.name) or option.env_default()
        for option in OPTIONS
        if option.name in ("target", "executor", "cluster")
    }
    if resolved["cluster"] or resolved["executor"] not in ("auto", "worker"):
        return
    for target in str(resolved["target"]).split(","):
        with contextlib.suppress(OSError):  # a worker that cannot be spawned now: as before
            launch_ahead(target.strip().lower())


def run(args: argparse.Namespace) -> int:
    """Execute, print one verdict line per report, write the files; return the exit code."""
    from neuron_workbench.cell.option_parsing import given_values
    from neuron_workbench.cell.options import RUN

    values = given_values(args, RUN)
    if Path(args.path).suffix.lower() == ".py" and Path(args.path).is_file():
        # the targets' workers import torch while this process does, below (not after it)
        _launch_workers_ahead(values)
    from neuron_workbench.cli.notebook_runner import (
        check_distinct,
        check_writable,
        junit_xml,
        run_document,
        run_notebook,
        run_script,
        terminal_message,
        terminal_progress,
        terminal_safe,
        write_text,
    )
    from neuron_workbench.compare.tolerances import check_pair
    from neuron_workbench.report.html import render_page

    check_pair(values.get("rtol"), values.get("atol"))
    if values.get("cluster"):
        from neuron_workbench.run.ray_cluster import parse_cluster

        values["cluster"] = parse_cluster(values["cluster"])
    suffix = Path(args.path).suffix.lower()
    if suffix not in (".ipynb", ".py"):
        raise WorkbenchUsageError(f"{args.path}: expected a notebook (.ipynb) or a script (.py)")
    if args.timeout <= 0:
        raise WorkbenchUsageError("--timeout must be a positive number of seconds")
    if Path(args.path).is_file():  # (a missing one is its own error, with nothing made)
        # the reports are written after the runs: a path they cannot take fails now, not then
        for report_path in (args.json, args.html, args.junit):
            check_writable(report_path)
        reports = {"--json": args.json, "--html": args.html, "--junit": args.junit}
        check_distinct(reports, [args.path])
        check_writable(args.record, folder=True)
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
    if against is not None and args.record:
        # each run would save its target-only artifact over the recording it compared against:
        # the reference runs, recorded on another machine, would be gone
        record = Path(args.record).resolve()
        written = record if suffix == ".ipynb" else record / f"{Path(args.path).stem}.nwrun.zip"
        if written == against:
            raise WorkbenchUsageError(
                f"--record {args.record} would overwrite the recording --against {args.against} "
                "compares with: record into another folder"
            )
    if suffix == ".ipynb" and (args.script_args or args.cwd):
        raise WorkbenchUsageError("`-- ARGS` and --cwd apply to a script (.py)")
    if suffix == ".ipynb":
        if args.record and not _notebook_supports_record_dir():
            raise WorkbenchUsageError(
                "--record for notebooks needs NeuronMagics.record_dir, which this version lacks"
            )
        result = run_notebook(
            args.path,
            # the command judges strictness from the reports (exit 3, 4): its cells need not raise
            options={k: v for k, v in values.items() if k not in _JUDGED_FROM_REPORTS},
            timeout=args.timeout,
            progress=terminal_progress,
            record_dir=str(Path(args.record).resolve()) if args.record else None,
            against_dir=str(against) if against is not None else None,
        )
    else:
        if values.get("seed") is None:
            # a script starts in a fresh process, whose Python and NumPy generators are seeded from
            # the OS: seeded runs give a CI job the same verdict every time
            values["seed"] = 0
        result = run_script(
            args.path,
            options=values,
            args=args.script_args,
            cwd=script_folder(args),
            progress=terminal_message,
            # relative to where the command runs, not to the folder the runs change to
            record_dir=str(Path(args.record).resolve()) if args.record else None,
            against=str(against) if against is not None else None,
            # a hung target in a worker is ended after --timeout, like a hung notebook cell
            timeout=float(args.timeout),
            # what the script prints shows as it prints it (its progress; all of it before a
            # Ctrl-C), as under `python SCRIPT`
            live=not args.quiet,
        )
        if result.script_exit is not None:  # the script's own usage message, or its --help
            code, text = result.script_exit
            if not result.shown_live:
                (sys.stdout if code == 0 else sys.stderr).write(text)
            return code
        if not args.quiet:
            show_printed(*result.printed, shown=result.shown_live)
    # in the notebook's order: a plain cell's error between the reports of the cells around it
    shown = sorted(
        [*result.reports, *result.cell_errors], key=lambda each: each.get("cell_index", 0)
    )
    for each in shown:
        if "summary" not in each:
            sys.stdout.write(
                terminal_safe(
                    f"cell {each['cell_index']}: raised {each['type']}: {each['message']}"
                )
                + "\n"
            )
            continue
        sys.stdout.write(terminal_safe(f"{each['label']}: {each['summary']}") + "\n")
        for warning in each.get("warnings") or ():  # as compare shows them (a recording's)
            sys.stderr.write(terminal_safe(f"{each['label']}: warning: {warning}") + "\n")
    if suffix == ".py" and args.cwd is None:
        raised = [
            ((report.get(role) or {}).get("error") or {})
            for report in result.reports
            for role in ("ref", "target")
        ]
        hint = cwd_hint(
            args.path, [(str(e.get("type", "")), str(e.get("message", ""))) for e in raised if e]
        )
        if hint:
            sys.stderr.write(terminal_safe(hint) + "\n")
    counts = result.verdict_counts()
    code = result.exit_code(
        bool(values.get("strict")),
        bool(values.get("strict_graph_breaks")),
        allowed=allowed_fallbacks(values),
    )
    summary = (
        f"{len(result.reports)} reports: "
        + verdict_summary(counts)
        + f"; {result.fallback_reports()} with CPU fallbacks; {len(result.cell_errors)} cell errors"
    )
    sys.stdout.write(summary + "\n")
    if not result.reports and not result.neuron_cells and result.kind == "notebook":
        # a CUDA notebook as it was written: the exit code alone says nothing
        sys.stderr.write(
            f"no %%neuron cell in {Path(result.path).name}: nothing was compared; put %%neuron "
            "at the top of each cell to compare\n"
        )
    if code == 3:  # which ops, where: the exit code alone does not say
        for line in result.fallback_violations(allowed_fallbacks(values)):
            sys.stderr.write(terminal_safe(line) + "\n")
    if code == 4:
        sys.stderr.write(terminal_safe(result.graph_break_violations()[0]) + "\n")
    options: dict[str, Any] = {
        **{name: value for name, value in values.items() if name != "cluster"},
        **({"on": values["cluster"]} if values.get("cluster") else {}),
        **({"args": list(args.script_args)} if args.script_args else {}),
    }
    name = Path(result.path).name
    stdout = getattr(args, "report_stdout", None)  # the command's own, where a report names -
    if args.json:
        document = run_document(
            result,
            strict=bool(values.get("strict")),
            options=options,
            strict_graph_breaks=bool(values.get("strict_graph_breaks")),
            allowed=allowed_fallbacks(values),
        )
        write_text(args.json, json.dumps(document, indent=2) + "\n", stdout)
    if args.html:
        write_text(
            args.html,
            render_page(result.reports, f"neuron-workbench: {name}", result.cell_errors),
            stdout,
        )
    if args.junit:
        write_text(
            args.junit,
            junit_xml(name, result.reports, result.cell_errors, result.cell_seconds),
            stdout,
        )
    return code
