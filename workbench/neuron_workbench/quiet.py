"""Warnings ignored for a moment without disturbing the ones already shown.

``warnings.catch_warnings`` tells every module that the filters changed, which empties their
once-per-line registries: a deprecation a cell's loop had shown once (``torch.cuda.amp.autocast()``
each step) showed again the next time round, as plain code never shows it. The workbench's own
quiet moments (registering CUDA's autocast lists, compiling a request again where it arrives) use
:func:`warnings_ignored` instead.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

__all__ = ["warnings_ignored"]


@contextlib.contextmanager
def warnings_ignored() -> Iterator[None]:
    """Every warning ignored meanwhile; the filters, and what was shown, left as they were."""
    saved = list(warnings.filters)
    warnings.filters.insert(0, ("ignore", None, Warning, None, 0))
    try:
        yield
    finally:
        warnings.filters[:] = saved
