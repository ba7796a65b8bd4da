"""The notebook's warning filters, mirrored into a target process for its run.

``warnings.filterwarnings("ignore")`` or ``warnings.simplefilter("error", UserWarning)`` in a plain
cell set the kernel's filters; a target in another process (a worker, a Ray actor) kept Python's
defaults. A warning the notebook turns into an error then raised in the reference run alone (an
ERROR blaming the cpu, or a FAIL where the cell catches it), and a warning the notebook silenced
showed in the target's output (``--keep target``). On a GPU and on the vendor's machine both runs
see the notebook's filters. Each run request carries the kernel's filters (:func:`current`) and
the target process takes them before the run (:func:`apply`), ahead of its own.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["apply", "current"]

#: This process's filters before its first request (what importing its device SDK added).
_before_requests: list[Any] | None = None


def current() -> list[Any]:
    """The warning filters of this process, first match first, as :func:`apply` takes them."""
    return list(warnings.filters)


def apply(filters: list[Any] | None) -> None:
    """Take the filters :func:`current` read in another process (None: leave them as they are).

    The process's own filters from before its first request come after them, so the notebook's
    decide wherever they apply. Nothing changes when the filters are already these: a change tells
    every module that the filters changed, which empties their once-per-line registries, and a
    deprecation a loop had shown once would show again with each cell.
    """
    global _before_requests
    if filters is None:
        return
    if _before_requests is None:
        _before_requests = list(warnings.filters)
    wanted = [*filters, *(entry for entry in _before_requests if entry not in filters)]
    if wanted == warnings.filters:
        return
    warnings.resetwarnings()  # (the public way to say the filters changed)
    warnings.filters.extend(wanted)
