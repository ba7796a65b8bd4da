"""AWS Trainium through TorchNeuron (device ``neuron``), or the emulated ``neuron`` device.

On the real backend the adapter follows ``shared/notes/torchneuron.md``: ``torch.neuron`` memory,
seed and synchronize calls (§4, §9), and CPU fallbacks from the op-tracking API
(``clear_op_tracking`` / ``get_fallback_ops``, §6.3), which gives unique op names only; a dispatch
recorder adds how often each op was called and from which line (§14.1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from neuron_workbench.backends.accelerator import (
    NOT_AVAILABLE,
    AcceleratorBackend,
    DispatchCallRecorder,
)
from neuron_workbench.backends.base import FallbackRecording

#: ``torch.neuron`` functions listed in shared/notes/torchneuron.md §4 that the adapter uses.
_DOCUMENTED = frozenset(
    {
        "is_available", "device_count", "get_device_name", "get_device_properties",
        "synchronize", "manual_seed", "manual_seed_all", "memory_allocated",
        "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_stats",
        "reset_peak_memory_stats",
    }
)  # fmt: skip

_TRACKING = ("clear_op_tracking", "get_fallback_ops")


class NeuronBackend(AcceleratorBackend):
    """TorchNeuron's ``neuron`` device; emulated when ``torch_neuronx`` is not loaded."""

    name = "neuron"
    sdk_module = "torch_neuronx"
    sdk_distribution = "torch-neuronx"
    documented_calls = _DOCUMENTED

    def _fallback_tracking_how(self) -> str:
        sdk = self.sdk()
        if sdk is None or not all(callable(getattr(sdk, n, None)) for n in _TRACKING):
            return f"{NOT_AVAILABLE} (torch_neuronx has no get_fallback_ops/clear_op_tracking)"
        return "torch_neuronx.get_fallback_ops (names) + dispatch recorder (counts, sites)"

    @contextlib.contextmanager
    def _real_fallback_tracking(self, recording: FallbackRecording) -> Iterator[None]:
        # TorchNeuron's op tracking (torchneuron.md §6.3): unique op names only, complete only
        # after a synchronize (execution is asynchronous); counts and sites come from the recorder.
        sdk = self.sdk()
        if sdk is None or not all(callable(getattr(sdk, n, None)) for n in _TRACKING):
            yield
            return
        sdk.clear_op_tracking()
        recorder = DispatchCallRecorder()
        try:
            with recorder.recording():
                yield
        finally:
            self._device_call("synchronize")
            recording.events = recorder.events_for(
                sorted(str(n) for n in sdk.get_fallback_ops()),
                source="torch_neuronx.get_fallback_ops + dispatch recorder",
            )
