"""The backend interface: one small adapter per device kind.

Public methods live on :class:`Backend` and stay thin; subclasses implement the ``_*_impl`` hooks.
Backends import device SDKs (``torch_neuronx``, ``torch_tpu``) lazily, inside those hooks, and are the
only layer allowed to do so.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from neuron_workbench.errors import BackendUnavailable


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, and if not, why (a sentence a user can act on)."""

    ok: bool
    reason: str = ""
    emulated: bool = False

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class BackendInfo:
    """How a run's backend is named in every report.

    Attributes
    ----------
    name : str
        The backend name the user typed (``cpu``, ``cuda``, ``neuron``, ``tpu``).
    device : str
        The torch device the run's tensors lived on, e.g. ``neuron:0``.
    device_name : str
        A human name of the hardware, e.g. the GPU model or ``emulated neuron (host CPU)``.
    emulated : bool
        True when the device is the workbench's pure-Python emulation.
    details : dict
        Backend-specific facts worth recording (emulator profile and provenance, versions).
        ``details["ran_on"]`` names where a remote target ran (``ray://host:10001``).
    """

    name: str
    device: str
    device_name: str
    emulated: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How reports name the backend: ``neuron (emulated)``, ``cpu (as cuda)``, or the name.

        A remote run adds where it ran: ``neuron on ray://host:10001``.
        """
        ran_on = self.details.get("ran_on")
        where = f" on {ran_on}" if ran_on else ""
        if self.emulated:
            return f"{self.name} (emulated){where}"
        if self.details.get("kind") == "fake":  # a test stand-in of the vendor SDK
            return f"{self.name} (fake){where}"
        stands_in_for = self.details.get("stands_in_for")
        return (f"{self.name} (as {stands_in_for})" if stands_in_for else self.name) + where

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "device": self.device,
            "device_name": self.device_name,
            "emulated": self.emulated,
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackendInfo:
        """Inverse of :meth:`to_dict`."""
        return cls(
            name=str(data["name"]),
            device=str(data["device"]),
            device_name=str(data.get("device_name", "")),
            emulated=bool(data.get("emulated", False)),
            details=dict(data.get("details", {})),
        )


@dataclass(frozen=True)
class MemoryStats:
    """Device memory of one run, in bytes; ``None`` where the backend cannot tell."""

    current_bytes: int | None = None
    peak_bytes: int | None = None


class FallbackRecording:
    """Collects the ops that ran on CPU instead of the device during one run.

    The base class records nothing (CPU and CUDA have no fallback). ``events`` are plain dicts with at
    least ``op`` and ``count``; the emulator and the real TorchNeuron adapter add more keys.
    ``rule_ops`` counts the ops each emulated numeric rule touched (emulated devices only).
    """

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.rule_ops: dict[str, int] = {}


class Backend(ABC):
    """One device kind the workbench can run a cell on."""

    #: The name users type: ``cpu``, ``cuda``, ``neuron``, ``tpu``.
    name: str = ""

    @property
    def device_type(self) -> str:
        """The torch device type tensors live on during a run (usually equal to :attr:`name`)."""
        return self.name

    @property
    def device(self) -> Any:
        """The ``torch.device`` of this backend's runs."""
        import torch

        return (
            torch.device(self.device_type, 0) if self.device_type != "cpu" else torch.device("cpu")
        )

    def options(self) -> dict[str, Any]:
        """The adapter's options as ``get_backend(name, **options)`` takes them (none here).

        A worker process builds its own adapter from these, so a cell's options reach it.
        """
        return {}

    def availability(self) -> Availability:
        """Whether this backend can run here; never raises."""
        try:
            return self._availability_impl()
        except Exception as exc:  # an SDK import can fail in many ways; report it, do not crash
            return Availability(False, f"{self.name} is not available: {type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def activated(self) -> Iterator[Backend]:
        """Activate the backend for one run, raising :class:`BackendUnavailable` if it cannot."""
        avail = self.availability()
        if not avail:
            raise BackendUnavailable(avail.reason)
        self._activate_impl()
        try:
            yield self
        finally:
            self._deactivate_impl()

    def info(self) -> BackendInfo:
        """How this backend is named in reports (call inside or after :meth:`activated`)."""
        return self._info_impl()

    def synchronize(self) -> None:
        """Wait for queued device work, so timings and memory readings are complete."""
        self._synchronize_impl()

    def memory_stats(self) -> MemoryStats:
        """Current and peak device memory since the last :meth:`reset_peak_memory`."""
        return self._memory_stats_impl()

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window."""
        self._reset_peak_memory_impl()

    def manual_seed(self, seed: int) -> None:
        """Seed the host generator and this device's generators (without touching ``torch.cuda``)."""
        import torch

        torch.default_generator.manual_seed(seed)
        self._manual_seed_impl(seed)

    def fallback_recording(self) -> contextlib.AbstractContextManager[FallbackRecording]:
        """A context manager that collects CPU-fallback events of the ops run inside it."""
        return contextlib.nullcontext(FallbackRecording())

    def memory_on_host(self) -> bool:
        """Whether this device's storages are host memory this process can read in place.

        True only for a device emulated on the host with real storages (the emulator's native
        core); a real accelerator's memory must be copied to the host to be read.
        """
        return False

    # -- hooks ---------------------------------------------------------------------------------
    @abstractmethod
    def _availability_impl(self) -> Availability: ...

    def _activate_impl(self) -> None:
        """Prepare the device (install the emulator, initialise a runtime). Default: nothing."""

    def _deactivate_impl(self) -> None:
        """Undo what :meth:`_activate_impl` may undo. Default: nothing."""

    @abstractmethod
    def _info_impl(self) -> BackendInfo: ...

    def _synchronize_impl(self) -> None:
        """Default: the device is synchronous."""

    def _manual_seed_impl(self, seed: int) -> None:
        """Seed device generators beyond the host one. Default: none."""

    def _memory_stats_impl(self) -> MemoryStats:
        return MemoryStats()

    def _reset_peak_memory_impl(self) -> None:
        """Default: nothing to reset."""
