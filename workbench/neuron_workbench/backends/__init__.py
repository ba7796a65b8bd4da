"""Backend adapters: ``cpu``, ``cuda``, ``neuron``, ``tpu``."""

from neuron_workbench.backends.base import Availability, Backend, BackendInfo, MemoryStats
from neuron_workbench.backends.registry import (
    BACKEND_NAMES,
    backend_table,
    default_reference,
    get_backend,
)

__all__ = [
    "BACKEND_NAMES",
    "Availability",
    "Backend",
    "BackendInfo",
    "MemoryStats",
    "backend_table",
    "default_reference",
    "get_backend",
]
