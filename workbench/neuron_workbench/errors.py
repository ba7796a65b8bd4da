"""Exception types shared by every layer.

Only :class:`WorkbenchUsageError` travels to the user as a one-line message: the magic layer turns it
into IPython's ``UsageError`` and the command line into a message on stderr and exit code 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class WorkbenchError(Exception):
    """Base class of every error the workbench raises on purpose."""


class WorkbenchUsageError(WorkbenchError):
    """Bad input from the user: an unknown backend, a bad flag value, an unreadable file."""


class BackendUnavailable(WorkbenchUsageError):
    """A backend was asked for but cannot run here; the message says why."""


class OptionError(WorkbenchUsageError):
    """A bad option value, named in the Python API's terms so that each front end can spell it.

    The core names options by their API name (``rtol``, ``steps``, ``per_output``), never as a
    command-line flag; ``str()`` shows those names, and :meth:`spelled` lets the command line and
    ``%%neuron`` show their own spelling (``--rtol``, ``--steps``, ``--tol``).

    Parameters
    ----------
    template : str
        The message, with ``{0}``, ``{1}``, ... where the options go and ``{name}`` fields for
        ``values`` (user text goes in ``values``, never into the template, so braces in it are
        kept as they are).
    *options : str
        API names of the options the message is about, in placeholder order.
    **values
        Further fields of the template.

    Examples
    --------
    >>> err = OptionError("give {0} and {1} together, or neither", "rtol", "atol")
    >>> str(err)
    'give rtol and atol together, or neither'
    >>> err.spelled(lambda name: "--" + name)
    'give --rtol and --atol together, or neither'
    """

    def __init__(self, template: str, *options: str, **values: Any) -> None:
        self.template = template
        self.options = options
        self.values = values
        super().__init__(self.spelled(str))

    def spelled(self, spell: Callable[[str], str]) -> str:
        """The message with each option name passed through ``spell``."""
        return self.template.format(*(spell(name) for name in self.options), **self.values)


#: The attribute an interrupt carries to say which run it stopped (see :func:`note_interrupted`).
_INTERRUPTED = "neuron_workbench_interrupted"


def note_interrupted(interrupt: BaseException, where: str) -> None:
    """Note on ``interrupt`` (a ``KeyboardInterrupt``) where it stopped the cell.

    ``where`` completes "interrupted ...": ``during the reference run (cpu (as cuda))``. The
    innermost note stays: a run inside a run (an oracle's) says which one it was.
    """
    if getattr(interrupt, _INTERRUPTED, None) is None:
        setattr(interrupt, _INTERRUPTED, where)


def interrupted_where(interrupt: BaseException) -> str | None:
    """What :func:`note_interrupted` noted on ``interrupt``, or None."""
    return getattr(interrupt, _INTERRUPTED, None)
