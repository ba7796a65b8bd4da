"""The Python device guard, and how a Python error survives the autograd device thread.

Why this exists (the root cause of "terminate called without an active exception"): when a Python
kernel (``__torch_dispatch__``, a ``torch.library`` kernel, a tensor hook) raises during backward,
torch throws a C++ ``python_error`` and leaves the Python error indicator set while the stack
unwinds. On the autograd device thread the engine holds a stream guard for the node; its destructor
calls ``PythonDeviceGuard::exchangeStream`` (``noexcept``), which calls the guard's Python
``type_``. CPython refuses to call anything while an error is pending ("returned a result with an
exception set"), pybind11 throws, and the ``noexcept`` frame calls ``std::terminate``: SIGABRT.

The fix: ``type_`` first takes the pending error off the indicator (``PyErr_Fetch`` through ctypes,
with no argument conversion that could call Python), so every call succeeds, and keeps it. The
engine then reports a ``SystemError`` without a message; :class:`EngineProxy` (installed as
``Variable._execution_engine``) replaces that with the original exception.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any

import torch

_PU1 = torch._C._autograd.DeviceType.PrivateUse1

# No argtypes on purpose: converting arguments through from_param would call isinstance in Python,
# which fails while an error is pending. byref() objects are passed as they are.
_fetch = ctypes.pythonapi.PyErr_Fetch
_fetch.restype = None
_decref = ctypes.pythonapi.Py_DecRef
_decref.argtypes = [ctypes.c_void_p]
_decref.restype = None
_ET, _EV, _ETB = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
_RT, _RV, _RTB = ctypes.byref(_ET), ctypes.byref(_EV), ctypes.byref(_ETB)

_taken_lock = threading.Lock()
_taken: list[tuple[int, BaseException]] = []  # (sequence number, exception), newest last
_seq = itertools.count(1)
_MAX_TAKEN = 4  # unclaimed errors (e.g. from a forward-path guard) hold frames: keep few


def _as_object(ptr: int | None) -> Any:
    return ctypes.cast(ptr, ctypes.py_object).value if ptr else None


def _keep_fetched() -> None:
    """Turn the fetched (type, value, traceback) references into an exception and keep it."""
    ptrs = (_ET.value, _EV.value, _ETB.value)
    _ET.value = _EV.value = _ETB.value = None
    etype, value, tb = (_as_object(p) for p in ptrs)
    for p in ptrs:
        if p:
            _decref(p)  # PyErr_Fetch handed us these references; _as_object took its own
    if isinstance(value, BaseException):
        exc = value
    elif isinstance(etype, type) and issubclass(etype, BaseException):
        exc = etype() if value is None else etype(value)
    else:
        exc = RuntimeError(f"error raised on the autograd device thread: {value!r}")
    if tb is not None and exc.__traceback__ is None:
        exc = exc.with_traceback(tb)
    with _taken_lock:
        _taken.append((next(_seq), exc))
        del _taken[:-_MAX_TAKEN]


def current_sequence() -> int:
    """A marker: errors taken after it are returned by :func:`take_error_since`."""
    with _taken_lock:
        return _taken[-1][0] if _taken else 0


def take_error_since(marker: int) -> BaseException | None:
    """The newest error taken off the indicator after ``marker`` (and forget it)."""
    with _taken_lock:
        for i in range(len(_taken) - 1, -1, -1):
            seq, exc = _taken[i]
            if seq > marker:
                del _taken[i]
                return exc
            break
    return None


class DeviceGuard(torch._C._acc.DeviceGuard):
    """The mandatory PrivateUse1 device guard (without it every ``.to(device)`` fails)."""

    def type_(self) -> Any:
        # Must stay the first call in this method: nothing else can be called while a Python
        # error is pending (see the module docstring).
        _fetch(_RT, _RV, _RTB)
        if _ET.value is not None:
            _keep_fetched()
        return _PU1


class EngineProxy:
    """``Variable._execution_engine`` that re-raises errors the device guard kept.

    Parameters
    ----------
    engine
        The original ``torch._C._ImperativeEngine``; every other attribute is delegated to it.
    """

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def run_backward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the C++ engine; a message-less SystemError becomes the original exception."""
        marker = current_sequence()
        try:
            return self._engine.run_backward(*args, **kwargs)
        except SystemError as err:
            original = take_error_since(marker)
            if original is None:
                raise
            raise original from err.__cause__

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def install_engine_proxy() -> None:
    """Wrap ``torch.autograd.Variable._execution_engine`` once per process."""
    from torch.autograd.variable import Variable

    if not isinstance(Variable._execution_engine, EngineProxy):
        Variable._execution_engine = EngineProxy(Variable._execution_engine)
