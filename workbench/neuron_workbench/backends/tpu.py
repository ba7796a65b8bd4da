"""Google TPU through TorchTPU (device ``tpu``), or the emulated ``tpu`` device.

TorchTPU's CPU fallback is off by default: an op without a TPU kernel raises. The emulated device does
the same, so a run that reaches such an op ends in an error naming it.
"""

from __future__ import annotations

from neuron_workbench.backends.accelerator import AcceleratorBackend


class TpuBackend(AcceleratorBackend):
    """TorchTPU's ``tpu`` device; emulated when ``torch_tpu`` is not loaded."""

    name = "tpu"
    sdk_module = "torch_tpu"
