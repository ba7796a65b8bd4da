"""The pandas options a notebook sets in its cells, mirrored into a target process.

``pd.set_option("display.precision", 2)`` in a plain cell sets the kernel's pandas; a target in
another process (a worker, a Ray actor) kept pandas' defaults, so a string the cell made of a
DataFrame (``str(df)``, a report line) differed between the runs (a FAIL: ``1.12`` against
``1.123456``), as would anything an option changes. Each run request carries the
kernel's options (:func:`current`) and the target process takes them before the run
(:func:`apply`), as :mod:`~neuron_workbench.run.numpy_settings` does for NumPy's.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from neuron_workbench.quiet import warnings_ignored

__all__ = ["apply", "current"]


def current() -> dict[str, Any] | None:
    """Every pandas option of this process by its full name (None: pandas not imported)."""
    pandas = sys.modules.get("pandas")
    if pandas is None:  # nothing the notebook set; importing it would cost every kernel
        return None
    with warnings_ignored():  # a deprecated option warns when it is read
        return _options(pandas.options, "")


def _options(group: Any, prefix: str) -> dict[str, Any]:
    """The options under ``group`` (``pandas.options`` or one of its groups), by full name."""
    found: dict[str, Any] = {}
    for name in dir(group):
        value = getattr(group, name)
        if type(value) is type(group):  # a group of options (display.*)
            found.update(_options(value, f"{prefix}{name}."))
        else:
            found[f"{prefix}{name}"] = value
    return found


def apply(options: dict[str, Any] | None) -> None:
    """Take the options :func:`current` read in another process (None: leave pandas as it is)."""
    pandas = sys.modules.get("pandas")
    if options is None or pandas is None:
        # A cell working with pandas reads `pd` or a DataFrame, which imported it here as the
        # request was loaded; a process that has no use for it is spared importing it
        return
    with warnings_ignored():  # (a deprecated option warns when it is read or set)
        for name, value in options.items():
            # an option this pandas does not have or refuses stays as it is
            with contextlib.suppress(Exception):
                if pandas.get_option(name) != value:
                    pandas.set_option(name, value)
