"""``neuron-workbench record SCRIPT.py --backend B -o PATH``: record a reference run to compare later.

CUDA and Trainium never share a host: run this on the GPU machine, copy the artifact, and run
``neuron-workbench compare`` (or ``%%neuron --against PATH``) on the Trainium machine. What the
script printed is shown before the ``recorded ...`` line, as ``neuron-workbench run`` shows it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "record"
HELP = "Run a CUDA script once on one backend and save its outputs as a run artifact (role 'ref')."
#: ``record train.py [options] -- ARGS``: the script's own arguments follow ``--``.
SCRIPT_ARGS = True


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options."""
    from neuron_workbench.cell.option_parsing import add_arguments
    from neuron_workbench.cell.options import RECORD
    from neuron_workbench.cli.commands.run import add_script_options

    parser.add_argument(
        "script",
        help="the script (.py) to run, written for CUDA; its own arguments follow `--`",
    )
    add_script_options(parser)
    parser.add_argument(
        "--backend", metavar="BACKEND", help="backend to run on (default: cuda if usable, else cpu)"
    )
    parser.add_argument(
        "-o", "--output", metavar="PATH", required=True, help="artifact file to write (*.nwrun.zip)"
    )
    parser.add_argument(
        "--role", default="ref", help="role of the run in the artifact (default ref)"
    )
    add_arguments(parser, RECORD)  # the option table's: --seed


def run(args: argparse.Namespace) -> int:
    """Run the script, save the artifact, show its output and one line; 0 ran, 1 raised."""
    from neuron_workbench.artifacts import ROLE_RULE, is_valid_role, save
    from neuron_workbench.backends import default_reference, get_backend
    from neuron_workbench.cell.session import Session
    from neuron_workbench.cli.commands.run import script_folder, show_printed
    from neuron_workbench.cli.notebook_runner import (
        check_distinct,
        check_writable,
        compile_script,
        read_script,
        script_exit,
        script_namespace,
        script_run_context,
        terminal_message,
    )
    from neuron_workbench.errors import WorkbenchUsageError
    from neuron_workbench.run.scalars import scalar_instrument

    if not is_valid_role(args.role):
        raise WorkbenchUsageError(f"--role {args.role!r}: {ROLE_RULE}")
    if not args.script.endswith(".py"):
        raise WorkbenchUsageError(f"{args.script}: expected a Python script (.py)")
    backend = get_backend(args.backend or default_reference())  # unknown names fail before running
    source = read_script(args.script)
    check_writable(args.output)  # the artifact is saved after the run: a bad path fails now
    check_distinct({"-o": args.output}, [args.script])
    program = compile_script(args.script, source)
    terminal_message(f"running {Path(args.script).name} on {backend.name}")
    cwd = script_folder(args)
    context = script_run_context(args.script, args.script_args, cwd)
    namespace = script_namespace(args.script)  # before the run changes folder: __file__ resolves
    # the script's argv, working folder and its folder first on sys.path are the run's alone (the
    # instrument): the workbench's own imports around it do not look in the script's folder first
    with context.around_runs():
        session = Session()
        try:
            recorded = session.record_run(
                program,
                namespace,
                backend.name,
                seed=args.seed if args.seed is not None else 0,
                instruments={"script": context, "scalars": scalar_instrument()},
            )
        finally:
            session.close()
    from neuron_workbench.cli.commands.show import scalar_counts, scalars_phrase
    from neuron_workbench.compare.flatten import iter_leaves

    outputs = sum(1 for _ in iter_leaves(recorded.outputs))
    # the script's own --help, which ran to its end with nothing to record: its help and exit 0,
    # as under `run SCRIPT -- --help`; an artifact of it was saved ("0 outputs"), compared later
    # as if it were the reference run
    asked = any(arg in ("-h", "--help") for arg in args.script_args)
    helped = asked and not outputs and not scalar_counts(recorded)[0]
    exited = script_exit(recorded, exited_ok=helped)
    if exited is not None:  # argparse's usage error: the script's own message, nothing saved
        (sys.stdout if exited[0] == 0 else sys.stderr).write(exited[1])
        return exited[0]
    # what the script printed, before the line the command adds, as `run SCRIPT` shows it
    if not args.quiet:
        show_printed(recorded.stdout, recorded.stderr)
    path = save(args.output, runs={args.role: recorded}, cell_source=source)
    label = recorded.backend.label
    if recorded.error is not None:
        where = f" (line {recorded.error.lineno})" if recorded.error.lineno else ""
        sys.stdout.write(
            f"recorded {label} run that raised {recorded.error.summary}{where} -> {path}\n"
        )
        if args.cwd is None:  # a config named from a repository's root, missed from scripts/
            from neuron_workbench.cli.commands.run import cwd_hint

            hint = cwd_hint(args.script, [(recorded.error.type, recorded.error.message)])
            if hint:
                sys.stderr.write(hint + "\n")
        return 1
    # a training script's loss curve is what compare judges it by: "0 outputs" alone read as an
    # empty recording
    scalars = scalars_phrase(*scalar_counts(recorded))
    fallback_ops = recorded.fallback_ops()
    count = len(fallback_ops)
    extra = f"; {count} op{'s' if count != 1 else ''} fell back to CPU" if fallback_ops else ""
    scalars = f", {scalars}" if scalars else ""
    sys.stdout.write(f"recorded {label} run: {outputs} outputs{scalars}{extra} -> {path}\n")
    return 0
