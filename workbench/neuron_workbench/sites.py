"""Where an op was called from: the first line of user code and the running ``nn.Module``.

Shared by everything that attributes ops to source lines: the emulator's fallback events, the
backends' fallback tracking on real devices, and the op profiler. It sits below all of them (it
needs only torch), so none of them imports another for it.

A frame is *internal* (never a user's line) when its file is under torch or this package, is a
frozen module, ``contextlib`` or ``typing_extensions``, or was registered with
:func:`mark_internal` (e.g. a fake device SDK's own files in the tests).
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch

__all__ = ["SourceSite", "find_site_and_module", "is_internal", "mark_internal"]


@dataclass(frozen=True)
class SourceSite:
    """A line of user code: the first frame outside torch and neuron_workbench."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_internal_cache: dict[str, bool] = {}
_MODULE_CALL_CODES = frozenset(
    c
    for c in (
        getattr(torch.nn.Module, "_call_impl", None),
        getattr(torch.nn.Module, "_wrapped_call_impl", None),
    )
    if c is not None
    for c in [c.__code__]
)


def is_internal(filename: str) -> bool:
    """Whether frames of ``filename`` are library code rather than a user's line."""
    r = _internal_cache.get(filename)
    if r is None:
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        r = (
            path.startswith(_TORCH_DIR)
            or path.startswith(_PKG_DIR)
            or filename.startswith("<frozen")
            or os.sep + "contextlib.py" in path
            or os.sep + "typing_extensions.py" in path
        )
        _internal_cache[filename] = r
    return r


def mark_internal(filenames: Iterable[str]) -> None:
    """Treat frames of these files as library code from now on (never a user's source line).

    Parameters
    ----------
    filenames : iterable of str
        Source file paths as they appear in code objects (``co_filename``).
    """
    for filename in filenames:
        _internal_cache[filename] = True


_names_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _module_name(root: torch.nn.Module, mod: torch.nn.Module) -> str:
    if mod is root:
        return ""
    names = _names_cache.get(root)
    if names is None or id(mod) not in names:
        names = {id(m): n for n, m in root.named_modules(remove_duplicate=False)}
        _names_cache[root] = names
    return names.get(id(mod), "")


def find_site_and_module(skip: int = 2) -> tuple[SourceSite | None, str, str]:
    """Walk the caller's stack: first user frame, and the innermost running ``nn.Module``.

    Parameters
    ----------
    skip : int
        Frames to skip, counted from this function's caller (``sys._getframe(skip)``).

    Returns
    -------
    site : SourceSite or None
        The first frame that is not internal (see :func:`is_internal`); None when every frame is.
    module : str
        Qualified name of the innermost running module under the outermost one (``""`` for the
        root module or none).
    module_type : str
        Class name of that module (``""`` for none).
    """
    f = sys._getframe(skip)
    site = None
    modules: list[torch.nn.Module] = []
    while f is not None:
        co = f.f_code
        if co in _MODULE_CALL_CODES:
            m = f.f_locals.get("self")
            if m is not None and (not modules or modules[-1] is not m):
                modules.append(m)
        elif site is None and not is_internal(co.co_filename):
            site = SourceSite(co.co_filename, f.f_lineno, co.co_name)
        f = f.f_back
    if not modules:
        return site, "", ""
    inner = modules[0]
    return site, _module_name(modules[-1], inner), type(inner).__name__
