"""Who made a scalar: the user's ``file:line``, or nobody (torch's own code, the workbench's).

A run's tensor-to-scalar conversions (``loss.item()``) pass through its torch function mode and
:mod:`~neuron_workbench.run.measurements`; those frames, and torch's own dispatch, only pass the
call on, so the first frame past them is the one that asked.
"""

from __future__ import annotations

import os
import sys
import sysconfig

import torch

from neuron_workbench.sites import is_internal

__all__ = ["user_site"]

# The conversion hook's own frames (the run's torch function mode, the measurement module).
_HOOK_FILES = frozenset(
    os.path.abspath(os.path.join(os.path.dirname(__file__), name))
    for name in ("measurements.py", "remap.py")
)
# Python-level Tensor dunders (``f"{loss:.3f}"`` calls ``item()`` in torch/_tensor.py) and torch's
# override dispatch are the user's conversion, made through torch.
_THROUGH_TORCH = frozenset(os.path.abspath(m.__file__) for m in (torch._tensor, torch.overrides))


# The standard library passes a value on too: ``log.info("loss %.4f", loss)`` formats it in
# logging's LogRecord.getMessage, and the user's call is the one that logged it.
_STANDARD_LIBRARY = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep

_transparent_files: dict[str, bool] = {}


def _transparent(filename: str) -> bool:
    """Whether frames of ``filename`` only pass a conversion on (the hook, torch's, Python's own)."""
    found = _transparent_files.get(filename)
    if found is None:
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        found = _transparent_files[filename] = (
            path in _HOOK_FILES
            or path in _THROUGH_TORCH
            or (path.startswith(_STANDARD_LIBRARY) and _INSTALLED not in path)
        )
    return found


#: Packages installed into the standard library's folder (no virtual environment) are no part of it.
_INSTALLED = f"{os.sep}site-packages{os.sep}"


def user_site(skip: int = 2) -> str | None:
    """``file:line`` of the user's call that made a scalar, or None when torch or we made it."""
    frame = sys._getframe(skip)
    while frame is not None:
        # other torch function modes stacked on the run's (the precision budget's float64
        # oracle) pass the call on: transparent too
        code = frame.f_code
        if not _transparent(code.co_filename) and code.co_name != "__torch_function__":
            break
        frame = frame.f_back
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    if is_internal(filename):
        return None
    name = filename if filename.startswith("<") else os.path.basename(filename)
    return f"{name}:{frame.f_lineno}"
