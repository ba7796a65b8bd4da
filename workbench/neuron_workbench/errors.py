"""Exception types shared by every layer.

Only :class:`WorkbenchUsageError` travels to the user as a one-line message: the magic layer turns it
into IPython's ``UsageError`` and the command line into a message on stderr and exit code 2.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base class of every error the workbench raises on purpose."""


class WorkbenchUsageError(WorkbenchError):
    """Bad input from the user: an unknown backend, a bad flag value, an unreadable file."""


class BackendUnavailable(WorkbenchUsageError):
    """A backend was asked for but cannot run here; the message says why."""


class StrictModeFailure(WorkbenchError):
    """``--strict`` was given and ops fell back to CPU on the target."""
