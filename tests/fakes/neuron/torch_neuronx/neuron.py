"""FAKE ``torch_neuronx.neuron``: the module registered as ``torch.neuron``.

Only the functions ``shared/notes/torchneuron.md`` §4 lists, bound by :func:`_bind` to the
emulator's implementations (the fake device is synchronous, so stream and event calls return at
once). ``_is_in_bad_fork`` is PyTorch's PrivateUse1 convention that ``torch.manual_seed`` needs.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from fake_sdk_support import copy_functions

_DOCUMENTED = (
    "is_initialized", "init", "is_available", "device_count", "current_device", "set_device",
    "get_device_name", "device", "get_amp_supported_dtype", "is_bf16_supported",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
    "set_rng_state", "Stream", "Event", "stream", "current_stream", "default_stream",
    "set_stream", "synchronize", "memory_stats", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "memory_summary", "empty_cache", "get_dynamo_metrics",
    "reset_dynamo_metrics", "_is_in_bad_fork",
)  # fmt: skip

_MEMORY = (
    "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
    "memory_summary", "empty_cache",
)  # fmt: skip

_emulated: Any = None


class _Properties:
    """``get_device_properties`` result: ``name`` and ``total_memory``."""

    def __init__(self, name: str, total_memory: int) -> None:
        self.name = name
        self.total_memory = total_memory

    def __repr__(self) -> str:
        return f"_Properties(name={self.name!r}, total_memory={self.total_memory})"


def get_device_properties(device: Any = None) -> _Properties:
    """Name and total memory of the (fake) device."""
    props = _emulated.get_device_properties(device)
    return _Properties("fake Trainium (neuron_workbench emulator)", int(props.total_memory))


def wait_stream(stream: Any) -> None:
    """Nothing to wait for (synchronous fake)."""


def wait_event(event: Any) -> None:
    """Nothing to wait for (synchronous fake)."""


def record_event(event: Any = None) -> Any:
    """Record an event on the current stream (completes at once)."""
    return _emulated.current_stream().record_event(event)


def query() -> bool:
    """All work is complete (synchronous fake)."""
    return True


def _bind(emulated: Any) -> None:
    global _emulated
    _emulated = emulated
    me = sys.modules[__name__]
    copy_functions(emulated, me, _DOCUMENTED)
    memory = types.ModuleType("torch.neuron.memory")
    copy_functions(emulated, memory, _MEMORY)
    me.memory = memory
