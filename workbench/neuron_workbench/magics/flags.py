"""How the front ends (``%%neuron`` and the ``neuron-workbench`` command) spell options.

The core names options by their Python API names (``CompareOptions.steps``,
``TolerancePolicy.per_output``); both front ends share one flag spelling, the option table's
(:mod:`neuron_workbench.cell.options`), so that a message about an option reads the same in a
notebook and in a terminal.
"""

from __future__ import annotations

from neuron_workbench.cell.options import FLAGS, flag
from neuron_workbench.errors import OptionError, WorkbenchUsageError

__all__ = ["FLAGS", "flag", "usage_message"]


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
