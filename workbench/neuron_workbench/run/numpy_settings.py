"""NumPy's process-wide settings a notebook changes in its cells, mirrored into a target process.

``np.seterr(all="raise")`` or ``np.set_printoptions(precision=2)`` in a plain cell set the kernel's
NumPy; a target in another process (a worker, a Ray actor) kept NumPy's defaults. A division by
zero then raised ``FloatingPointError`` in the reference alone (an ERROR blaming the cpu), and a
string the cell made of an array (``str(arr)``, an f-string) differed between the runs (``FAIL
... t '[1.12 2.5 ]' != '[1.123456 2.5     ]'``). Each run request carries the kernel's settings
(:func:`current`) and the target process takes them before the run (:func:`apply`), as
:mod:`~neuron_workbench.run.torch_settings` does for torch's.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["apply", "current"]


def current() -> dict[str, Any] | None:
    """NumPy's settings in this process, as :func:`apply` takes them (None: NumPy not imported)."""
    numpy = sys.modules.get("numpy")
    if numpy is None:  # nothing the notebook set; importing it would cost every kernel
        return None
    return {"errors": numpy.geterr(), "print_options": numpy.get_printoptions()}


def apply(settings: dict[str, Any] | None) -> None:
    """Take the settings :func:`current` read in another process (None: leave NumPy as it is)."""
    if settings is None:
        return
    import numpy

    if numpy.geterr() != settings["errors"]:
        numpy.seterr(**settings["errors"])
    if numpy.get_printoptions() != settings["print_options"]:
        numpy.set_printoptions(**settings["print_options"])
