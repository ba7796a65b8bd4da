"""neuron-workbench: run CUDA-style PyTorch on a reference and a target backend, side by side.

``%load_ext neuron_workbench`` registers the ``%%neuron`` cell magic. The package import is kept light
(no torch, no IPython) because PyTorch imports it during ``import torch`` through the
``torch.backends`` autoload entry point.
"""

from __future__ import annotations

from typing import Any

from neuron_workbench.version import __version__

__all__ = ["__version__", "emulate", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """Register the workbench magics on an IPython shell (``%load_ext neuron_workbench``)."""
    from neuron_workbench.magics import register

    register(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Nothing to undo: magics stay registered until the kernel restarts, like other extensions."""


def emulate(device: str = "neuron", **options: Any) -> Any:
    """Install the emulated ``neuron`` or ``tpu`` device in this process (idempotent).

    See :func:`neuron_workbench.emulator.emulate` for the options and the returned status.
    """
    from neuron_workbench.emulator import emulate as _emulate

    return _emulate(device, **options)
