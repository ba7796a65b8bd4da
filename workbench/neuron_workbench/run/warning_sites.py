"""Warnings a run's torch calls raise name the line that made the call, as in plain code.

A run's torch function mode sits between the cell and torch: a warning torch raises in C++
(``torch.searchsorted(): input value tensor is non-contiguous``) or in Python with ``stacklevel=2``
(``F.softmax``'s implicit dimension) names the frame that called the function, which under the
mode is the workbench's ``__torch_function__``: users read ``.../neuron_workbench/run/remap.py:169:
UserWarning`` and the mode's own source line, where plain code shows their cell's line. While a
run lasts, such a warning is shown at the first frame outside the workbench and torch's
``__torch_function__`` dispatch (and past the function's own outer call, which the dispatch
repeats), as plain code would have named it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import torch.overrides

__all__ = ["warnings_at_callers_line"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_DISPATCH_FILE = os.path.abspath(torch.overrides.__file__)


def _through_the_mode(filename: str) -> bool:
    return filename.startswith(_PACKAGE_DIR) or filename == _DISPATCH_FILE


def callers_frame(filename: str, lineno: int, start: types.FrameType | None) -> tuple[Any, Any]:
    """The frame at ``filename:lineno``, and the one plain code would have named instead.

    ``start`` is a frame inside the warning's call (the warnings machinery's): the stack is walked
    outward from it to the frame at ``filename:lineno``, then past the workbench's and torch's
    dispatch frames. ``(None, None)`` when that frame is not on the stack.
    """
    frame = start
    inner: set[types.CodeType] = set()  # the function that warned, and the warnings machinery
    while frame is not None and not (
        frame.f_code.co_filename == filename and frame.f_lineno == lineno
    ):
        inner.add(frame.f_code)
        frame = frame.f_back
    named = frame
    while frame is not None and _through_the_mode(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is not None and frame.f_code in inner:
        # a torch function written in Python (F.softmax): its outer call, which the dispatch
        # repeated inside the mode; plain code's stacklevel=2 names the line that called it
        frame = frame.f_back
    return named, frame


@contextlib.contextmanager
def warnings_at_callers_line() -> Iterator[None]:
    """Show warnings that name a workbench line at the user's line instead, for the body."""
    shown = warnings.showwarning

    def showwarning(
        message: Any,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        if filename.startswith(_PACKAGE_DIR):
            mode_frame, frame = callers_frame(filename, lineno, sys._getframe(1))
            if frame is not None:
                # Decided again at the caller's line, as plain code decides it: its filters (a
                # module's "ignore") and its once-per-line registry. The mode's line forgets the
                # warning, or every later call would be taken for the first one's line.
                registry = mode_frame.f_globals.get("__warningregistry__")
                if isinstance(registry, dict):
                    registry.pop((str(message), category, lineno), None)
                where = frame.f_globals
                try:
                    warnings.warn_explicit(
                        message,
                        category,
                        frame.f_code.co_filename,
                        frame.f_lineno,
                        module=where.get("__name__"),
                        registry=where.setdefault("__warningregistry__", {}),
                        module_globals=where,
                    )
                finally:
                    # a warning raised as an error holds this frame: no cycle through it to the
                    # cell's frames (and their device tensors) for the collector to find later
                    del message, frame, mode_frame, where
                return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    try:
        yield
    finally:
        if warnings.showwarning is showwarning:  # a cell that set its own keeps it
            warnings.showwarning = shown
