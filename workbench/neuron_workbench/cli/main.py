"""Entry point of the ``neuron-workbench`` console script.

Exit codes shared by every subcommand: 0 success, 1 a comparison failed (``run``: or compared
nothing, verdict ``UNCOMPARED``), 2 usage or input error (one line on stderr, never a traceback),
3 ``--strict`` and ops fell back to CPU; 130 Ctrl-C, 143 SIGTERM, 141 the reader of the output went
away (``| head -1``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import signal
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType

from neuron_workbench.cli import commands
from neuron_workbench.errors import WorkbenchUsageError
from neuron_workbench.magics.flags import usage_message
from neuron_workbench.version import __version__

#: Exit code of a usage or input error (the other codes are the subcommands' results).
EXIT_USAGE = 2

#: The report options of ``run`` and ``compare``, whose value ``-`` means standard output.
_REPORT_OPTIONS = ("json", "html", "junit")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"neuron-workbench: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _command_modules() -> list[ModuleType]:
    found = []
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            found.append(importlib.import_module(f"{commands.__name__}.{info.name}"))
    return found


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with one subparser per module in :mod:`.commands`."""
    parser = _Parser(
        prog="neuron-workbench",
        description="Port CUDA PyTorch to Trainium (neuron) and TPU (tpu): run, compare, scan.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in _command_modules():
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.configure(p)
        p.set_defaults(_run=module.run)
    return parser


def _split_script_args(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``run train.py [options] -- ARGS``: the arguments after ``--`` are the script's own.

    Only for commands that take them (``SCRIPT_ARGS = True``); argparse alone would reject them
    after options, or read them as its own.
    """
    if "--" not in argv:
        return argv, None
    command = next((a for a in argv if not a.startswith("-")), None)
    takes = {m.NAME for m in _command_modules() if getattr(m, "SCRIPT_ARGS", False)}
    if command not in takes:
        return argv, None
    index = argv.index("--")
    return argv[:index], argv[index + 1 :]


def _unrecognized(args: argparse.Namespace, unknown: list[str], given_args: bool) -> str:
    """The message for ``unknown``; after a script without ``--``, it says where they go.

    ``run train.py --epochs 2`` (the ``--`` forgotten) said only "unrecognized arguments:
    --epochs 2", as if the workbench refused the script's options.
    """
    message = f"unrecognized arguments: {' '.join(unknown)}"
    script = getattr(args, "script", None) or getattr(args, "path", None)
    if not given_args and "script_args" in vars(args) and str(script).endswith(".py"):
        message += (
            f" (a script's own arguments follow --, after the command's options: "
            f"neuron-workbench {args.command} {script} [options] -- {' '.join(unknown)})"
        )
    return message


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is: its runs end as on Ctrl-C (workers stopped)."""


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


@contextlib.contextmanager
def _stdout_for_reports(args: argparse.Namespace) -> Iterator[None]:
    """Keep standard output for the report named ``-``; send everything else to stderr.

    ``args.report_stdout`` is the stream the report is written to. Writes below Python (a script's
    ``os.system``, a subprocess) go to fd 1 as well: it points at stderr meanwhile.
    """
    stdout = sys.stdout
    stdout.flush()
    try:
        real = stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):  # a caller's stream (a test's capture)
        real = False
    saved = os.dup(1) if real else None
    if saved is not None:
        os.dup2(2, 1)
        stdout = open(saved, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    args.report_stdout = stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            with contextlib.suppress(OSError):  # a reader gone: main says so (exit 141)
                stdout.close()  # flushes; the fd stays open (closefd=False)
            os.dup2(saved, 1)
            os.close(saved)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, script_args = _split_script_args(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(_unrecognized(args, unknown, script_args is not None))
    if script_args is not None:
        args.script_args = script_args
    # A SIGTERM (a CI job's timeout, `kill`) ended the command with no word and its workers left
    # to notice their parent was gone: it now ends as Ctrl-C does, with one line and exit 143.
    previous = None
    with contextlib.suppress(ValueError):  # not the main thread (a caller's): as it was
        previous = signal.signal(signal.SIGTERM, _terminated)
    # `--json -` (or --html, --junit): that report is the command's standard output, so that a
    # CI step can pipe it (`run train.py --json - | jq`); the command's own lines, and what a
    # script prints, go to stderr instead
    to_stdout = any(getattr(args, name, None) == "-" for name in _REPORT_OPTIONS)
    try:
        with _stdout_for_reports(args) if to_stdout else contextlib.nullcontext():
            return int(args._run(args))
    except WorkbenchUsageError as exc:
        from neuron_workbench.cli.notebook_runner import terminal_safe

        sys.stderr.write(terminal_safe(f"neuron-workbench: error: {usage_message(exc)}") + "\n")
        return EXIT_USAGE
    except _Terminated:
        sys.stderr.write("neuron-workbench: terminated (SIGTERM)\n")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        sys.stderr.write("neuron-workbench: interrupted\n")
        return 130
    except BrokenPipeError:
        # the reader of the output went away (`run train.py | head -1`): a traceback said so, and
        # another at exit, as Python flushed the closed stream; end as a shell's SIGPIPE does
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover - exercised through the console script
    raise SystemExit(main())
