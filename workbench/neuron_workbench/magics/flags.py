"""How the front ends (``%%neuron`` and the ``neuron-workbench`` command) spell options.

The core names options by their Python API names (``CompareOptions.steps``,
``TolerancePolicy.per_output``); both front ends share one flag spelling, the option table's
(:mod:`neuron_workbench.cell.options`), so that a message about an option reads the same in a
notebook and in a terminal.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from neuron_workbench.cell.options import FLAGS, flag
from neuron_workbench.errors import OptionError, WorkbenchUsageError

__all__ = ["FLAGS", "flag", "parsed_line", "usage_message"]


def parsed_line(magic: Callable[..., Any], line: str) -> argparse.Namespace | None:
    """The options of ``magic``'s line (IPython's ``parse_argstring``), or one usage line.

    ``-h`` or ``--help`` on the line prints the magic's help (as ``%%neuron?`` shows it) and gives
    ``None``: the caller runs nothing.

    Parameters
    ----------
    magic : callable
        The magic's method, decorated with IPython's ``magic_arguments``.
    line : str
        What follows the magic's name on its line.

    Returns
    -------
    argparse.Namespace or None
        The parsed options; ``None`` when the line asked for help.

    Raises
    ------
    UsageError
        For an option argparse refuses, and for a line that cannot be split into words (an
        unclosed quote: ``%%neuron --record 'runs/a b``), whose error IPython's splitter leaves
        as a traceback through ``shlex``.
    """
    # (IPython is imported here: the command line, which spells its errors with this module,
    # runs without it)
    from IPython.core.error import UsageError
    from IPython.core.magic_arguments import parse_argstring
    from IPython.utils.process import arg_split

    try:
        if "-h" in line and {"-h", "--help"} & set(arg_split(line)):
            # argparse's own -h is off in IPython's magic parsers: it was "unrecognized arguments"
            print(magic.parser.format_help())  # type: ignore[attr-defined]
            return None
        return parse_argstring(magic, line)
    except ValueError as exc:  # shlex's "No closing quotation"
        raise UsageError(f"{exc} in the options: {line.strip()}") from None


def usage_message(exc: WorkbenchUsageError) -> str:
    """The one-line message of a usage error, options spelled as flags.

    Parameters
    ----------
    exc : WorkbenchUsageError
        The error; an :class:`~neuron_workbench.errors.OptionError` names its options by API name.

    Returns
    -------
    str
        ``str(exc)``, with option names spelled as this front end's flags.
    """
    return exc.spelled(flag) if isinstance(exc, OptionError) else str(exc)
