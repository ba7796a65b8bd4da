"""AWS Trainium through TorchNeuron (device ``neuron``), or the emulated ``neuron`` device."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from neuron_workbench.backends.accelerator import AcceleratorBackend
from neuron_workbench.backends.base import FallbackRecording


class NeuronBackend(AcceleratorBackend):
    """TorchNeuron's ``neuron`` device; emulated when ``torch_neuronx`` is not loaded."""

    name = "neuron"
    sdk_module = "torch_neuronx"

    @contextlib.contextmanager
    def _real_fallback_tracking(self, recording: FallbackRecording) -> Iterator[None]:
        # TorchNeuron's op tracking (shared/notes/torchneuron.md §6.3): unique op names only, and
        # only complete after a synchronize, because execution is asynchronous.
        import torch
        import torch_neuronx

        torch_neuronx.clear_op_tracking()
        try:
            yield
        finally:
            torch.neuron.synchronize()
            recording.events = [
                {"op": str(name), "count": None, "source": "torch_neuronx.get_fallback_ops"}
                for name in sorted(torch_neuronx.get_fallback_ops())
            ]
