"""Shared plumbing of the FAKE ``torch_neuronx`` and ``torch_tpu`` packages in this folder.

The fakes stand in for the real SDKs in tests (put this folder on ``PYTHONPATH`` of a fresh
interpreter: their ``torch.backends`` entry points load them at ``import torch``, as the real
packages autoload). They implement the surface ``shared/notes/torchneuron.md`` and
``shared/notes/torchtpu.md`` document, on top of neuron_workbench's emulator: the emulator's
kernels own PrivateUse1 under the real device name, but the emulator itself is *not* "installed"
(``neuron_workbench.emulator.status()`` stays None), so the workbench sees a real backend. Every
fake says so in ``__neuron_workbench_fake__``, which the adapters put in each report.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_installed: str | None = None


def install_device(
    device: str, *, cpu_fallback: bool, narrow_64bit: bool, matmul_passes: int
) -> Any:
    """Register the emulator's kernels for ``device`` without marking the emulator installed.

    Returns the emulator's ``torch.<device>`` module (the fake wraps the documented part of it).
    """
    global _installed
    import torch

    from neuron_workbench.emulator import _core, _install
    from neuron_workbench.emulator.profiles import load_profile
    from neuron_workbench.sites import mark_internal

    if _installed is None:
        _install.install(device, load_profile(device, None))
        _installed = device
    elif _installed != device:
        raise RuntimeError(f"fake SDK: PrivateUse1 is already {_installed}")
    _core.CPU_FALLBACK = cpu_fallback
    _core.NARROW_64BIT = narrow_64bit
    _core.MATMUL_PASSES = matmul_passes
    _core.reset_plans()
    # Frames of the fakes are SDK internals, never a user's source line.
    here = os.path.dirname(os.path.abspath(__file__))
    mark_internal(
        os.path.join(root, name)
        for root, _dirs, files in os.walk(here)
        for name in files
        if name.endswith(".py")
    )
    return getattr(torch, device)


def replace_device_module(device: str, module: Any) -> None:
    """Make ``module`` the process's ``torch.<device>`` (the fake's documented surface only)."""
    import torch

    setattr(torch, device, module)
    sys.modules[f"torch.{device}"] = module
    memory = getattr(module, "memory", None)
    if memory is not None:
        sys.modules[f"torch.{device}.memory"] = memory


def copy_functions(source: Any, target: Any, names: tuple[str, ...]) -> None:
    """Copy the named attributes (each must exist on ``source``)."""
    for name in names:
        setattr(target, name, getattr(source, name))
