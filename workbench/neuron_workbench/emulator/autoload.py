"""``torch.backends`` autoload entry point: PyTorch calls :func:`autoload` during ``import torch``.

It does nothing (and imports nothing heavy) unless ``NEURON_WORKBENCH_EMULATE`` is ``neuron`` or
``tpu``; then it installs the emulated device, as TorchNeuron's own autoload installs the real one.
Set the variable before ``import torch``; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` disables all autoload.
"""

from __future__ import annotations

import os

from neuron_workbench.emulator.profiles import DEVICES

ENV = "NEURON_WORKBENCH_EMULATE"
REPORT_ENV = "NEURON_WORKBENCH_EMULATE_REPORT"


def autoload() -> None:
    """Install the emulated device named by ``NEURON_WORKBENCH_EMULATE`` (no-op when unset)."""
    device = os.environ.get(ENV, "").strip().lower()
    if device not in DEVICES:
        return
    import sys

    try:
        from neuron_workbench.emulator import emulate
        from neuron_workbench.emulator.runner import options_from_env

        emulate(device, **options_from_env())
    except Exception as exc:  # never break `import torch`; say why and carry on
        sys.stderr.write(f"neuron-workbench: {ENV}={device} ignored: {exc}\n")
        return
    report = os.environ.get(REPORT_ENV)
    if report:
        from neuron_workbench.emulator import runner

        runner.write_report_at_exit(report)
