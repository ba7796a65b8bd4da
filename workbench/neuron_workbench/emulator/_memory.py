"""Memory accounting of the pure-Python core's device.

One :class:`Allocation` per payload storage, shared by every wrapper viewing it; freed when the last
wrapper goes away (refcounting, so immediate in CPython). :data:`MEM` holds the counters that
``torch.<device>.memory_allocated()`` and friends read, and the capacity that makes an allocation
beyond it an out-of-memory error.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_mem_lock = threading.RLock()


class DeviceMemory:
    """The emulated device's allocation counters (one instance: :data:`MEM`)."""

    device_type = "neuron"  # named in the out-of-memory error; set at install
    current = 0
    peak = 0
    allocated_total = 0
    freed_total = 0
    num_allocs = 0
    num_frees = 0
    num_ooms = 0
    capacity: int | None = None

    def reset_peak(self) -> None:
        """Set the peak to the current allocation."""
        with _mem_lock:
            self.peak = self.current

    def reset_accumulated(self) -> None:
        """Zero the allocated/freed totals and counters."""
        with _mem_lock:
            self.allocated_total = self.freed_total = self.num_allocs = self.num_frees = 0
            self.num_ooms = 0


MEM = DeviceMemory()


class Allocation:
    """One payload storage's bytes, counted while any wrapper viewing it lives."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        with _mem_lock:
            cap = MEM.capacity
            if cap is not None and MEM.current + nbytes > cap:
                MEM.num_ooms += 1
                self.nbytes = 0
                raise torch.OutOfMemoryError(
                    f"emulated {MEM.device_type} out of memory: tried to allocate {nbytes} bytes "
                    f"({MEM.current} bytes allocated, capacity {cap} bytes set by "
                    f"emulate(capacity_bytes=...))"
                )
            self.nbytes = nbytes
            MEM.current += nbytes
            MEM.allocated_total += nbytes
            MEM.num_allocs += 1
            if MEM.current > MEM.peak:
                MEM.peak = MEM.current

    def __del__(self) -> None:
        n = self.nbytes
        if n:
            with _mem_lock:
                MEM.current -= n
                MEM.freed_total += n
                MEM.num_frees += 1

    def __deepcopy__(self, memo: dict) -> Allocation:  # never duplicate an accounting record
        return self

    def __reduce__(self) -> Any:
        raise TypeError("emulator memory record is not picklable")
