"""What ``torch.cuda`` resolves to while a run remaps CUDA onto another backend.

The shims forward ``torch.cuda``'s helpers that CUDA notebooks call (availability, synchronize,
seeding, memory statistics, events) to the run's backend; everything else still comes from the real
module.
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Iterator
from typing import Any

import torch

from neuron_workbench.backends.base import Backend


class HostEvent:
    """Stand-in for ``torch.cuda.Event``: records host time, since the run is synchronous here."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ):
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Any = None) -> None:
        """Mark the current host time."""
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        """Always complete."""
        return True

    def wait(self, stream: Any = None) -> None:
        """Nothing to wait for."""

    def elapsed_time(self, end_event: HostEvent) -> float:
        """Milliseconds between two recorded events (host time)."""
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0


def cuda_module_shims(backend: Backend) -> dict[str, Any]:
    """``torch.cuda`` attribute replacements that forward to ``backend``."""

    def synchronize(device: Any = None) -> None:
        backend.synchronize()

    def memory_allocated(device: Any = None) -> int:
        return backend.memory_stats().current_bytes or 0

    def max_memory_allocated(device: Any = None) -> int:
        return backend.memory_stats().peak_bytes or 0

    def reset_peak_memory_stats(device: Any = None) -> None:
        backend.reset_peak_memory()

    def get_device_name(device: Any = None) -> str:
        return backend.info().device_name

    def manual_seed(seed: int) -> None:
        # Not torch.manual_seed: it calls torch.cuda.manual_seed_all, which is this function.
        backend.manual_seed(int(seed))

    def init() -> None:
        return None

    def set_device(device: Any) -> None:
        return None

    def empty_cache() -> None:
        return None

    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": init,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": set_device,
        "synchronize": synchronize,
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed,
        "seed": torch.seed,
        "seed_all": torch.seed,
        "initial_seed": torch.initial_seed,
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": lambda new_state, device="cuda": torch.set_rng_state(new_state),
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_allocated,
        "max_memory_reserved": max_memory_allocated,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats,
        "empty_cache": empty_cache,
        "get_device_name": get_device_name,
        "is_bf16_supported": lambda *args, **kwargs: True,
        "Event": HostEvent,
    }


class CudaModuleShim(types.ModuleType):
    """What ``torch.cuda`` resolves to during a run: the shims, then the real module for the rest.

    Only the ``torch.cuda`` attribute of the ``torch`` package is swapped, never
    ``sys.modules["torch.cuda"]``: PyTorch internals (TorchDynamo's tracing rules, for one) look
    functions up there and must keep seeing the real ones.
    """

    def __init__(self, real: types.ModuleType, shims: dict[str, Any]) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__.update(shims)
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def patched_attributes(owner: Any, replacements: dict[str, Any]) -> Iterator[None]:
    """Set attributes of ``owner`` for the body; put back (or delete) each one afterwards."""
    missing = object()
    saved = {name: getattr(owner, name, missing) for name in replacements}
    try:
        for name, value in replacements.items():
            setattr(owner, name, value)
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
