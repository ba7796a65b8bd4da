"""FAKE ``torch_neuronx`` for neuron_workbench tests: no Trainium, the workbench emulator underneath.

Implements the surface ``shared/notes/torchneuron.md`` documents (§2 registration, §4 ``torch.neuron``
and the op-tracking functions, §9 memory) and nothing else: ``import torch`` autoloads it through
the ``torch.backends`` entry point ``torch_neuronx:_autoload`` (this folder's ``.dist-info``), and
the import registers PrivateUse1 as ``neuron``. Ops run on the emulator's kernels with TorchNeuron's
defaults (silent CPU fallback for ops outside the April-2026 coverage, 64-bit narrowing).
``nki_op``, ``wrap_nki`` and ``NeuronProfiler`` exist but raise: NKI and Neuron Explorer traces
cannot be faked.
"""

from __future__ import annotations

from typing import Any

import fake_sdk_support as _support

#: Read by neuron_workbench's adapters: every report of a run on this package says "fake".
__neuron_workbench_fake__ = (
    "fake torch_neuronx 2.14.3.0+fake: the neuron_workbench emulator on the host CPU, no Trainium"
)
__version__ = "2.14.3.0+fake"

_tracking: Any = None  # the emulator FallbackLog that backs get_fallback_ops()
_tracking_context: Any = None  # kept alive: closing it would stop the tracking
_executed: set[str] = set()


def _register() -> None:
    global _tracking, _tracking_context
    if _tracking is not None:
        return
    from neuron_workbench.emulator import _core, events
    from torch_neuronx import neuron as _neuron_module

    emulated = _support.install_device(
        "neuron", cpu_fallback=True, narrow_64bit=True, matmul_passes=0
    )
    _neuron_module._bind(emulated)
    _support.replace_device_module("neuron", _neuron_module)
    # get_fallback_ops(): the emulator's fallback events, from every thread, for the process.
    _tracking_context = events.record_fallbacks()
    _tracking = _tracking_context.__enter__()
    # get_executed_ops(): every op the device received.
    if _core.NATIVE_CORE is not None:
        _core.NATIVE_CORE.set_track_executed(True)
        return
    dispatch = _core.EmulatedTensor.__dict__["__torch_dispatch__"].__func__

    def __torch_dispatch__(cls: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        _executed.add(_core.overload_name(func))
        return dispatch(cls, func, types, args, kwargs)

    _core.EmulatedTensor.__torch_dispatch__ = classmethod(__torch_dispatch__)


def _autoload() -> None:
    """The ``torch.backends`` entry point (importing the package registers the device)."""
    _register()


def get_fallback_ops() -> list[str]:
    """Unique names of the ops that ran on CPU since :func:`clear_op_tracking` (no counts)."""
    return sorted({event.overload for event in _tracking.events})


def get_executed_ops() -> list[str]:
    """Unique names of the ops that ran since :func:`clear_op_tracking`."""
    from neuron_workbench.emulator import _core

    if _core.NATIVE_CORE is not None:
        return sorted(_core.NATIVE_CORE.executed_ops())
    return sorted(_executed)


def clear_op_tracking() -> None:
    """Forget the tracked op names."""
    from neuron_workbench.emulator import _core

    _tracking.clear()
    _executed.clear()
    if _core.NATIVE_CORE is not None:
        _core.NATIVE_CORE.clear_executed()


def nki_op(*args: Any, **kwargs: Any) -> Any:
    """NKI kernels cannot run on the fake."""
    raise NotImplementedError("fake torch_neuronx: NKI kernels are not emulated")


def wrap_nki(*args: Any, **kwargs: Any) -> Any:
    """NKI kernels cannot run on the fake."""
    raise NotImplementedError("fake torch_neuronx: NKI kernels are not emulated")


class NeuronProfiler:
    """Neuron Explorer traces cannot be made by the fake."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("fake torch_neuronx: NeuronProfiler is not emulated")


_register()

from torch_neuronx.neuron import (  # noqa: E402  (bound by _register above)
    Event,
    Stream,
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    synchronize,
)

__all__ = [
    "Event",
    "NeuronProfiler",
    "Stream",
    "clear_op_tracking",
    "empty_cache",
    "get_executed_ops",
    "get_fallback_ops",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "nki_op",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "synchronize",
    "wrap_nki",
]
