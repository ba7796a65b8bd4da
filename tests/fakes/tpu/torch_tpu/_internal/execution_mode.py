"""FAKE ``torch_tpu._internal.execution_mode``: the CPU-fallback switch and the eager modes.

``enable_cpu_fallback`` is a module property backed by ``_enable_cpu_fallback`` /
``_is_cpu_fallback_enabled``, as in the 0.2.0 wheel (``shared/notes/torchtpu.md`` §3).
"""

from __future__ import annotations

import enum
import sys
import types


def _enable_cpu_fallback(value: bool) -> None:
    from neuron_workbench.emulator import _core

    _core.CPU_FALLBACK = bool(value)
    _core.reset_plans()


def _is_cpu_fallback_enabled() -> bool:
    from neuron_workbench.emulator import _core

    return bool(_core.CPU_FALLBACK)


class EagerMode(enum.Enum):
    """TorchTPU's eager modes (§6); the fake runs every op synchronously in all of them."""

    DEFER_NEVER = "DEFER_NEVER"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "DEFER_NEVER_AND_LAUNCH_BLOCKING"
    DEFER_AND_FUSE = "DEFER_AND_FUSE"


_eager_mode = EagerMode.DEFER_NEVER


def set_eager_mode(mode: EagerMode) -> None:
    """Set the eager mode (recorded only)."""
    global _eager_mode
    _eager_mode = EagerMode(mode)


class _Module(types.ModuleType):
    @property
    def enable_cpu_fallback(self) -> bool:
        """Whether ops without a TPU kernel run on CPU (off by default)."""
        return _is_cpu_fallback_enabled()

    @enable_cpu_fallback.setter
    def enable_cpu_fallback(self, value: bool) -> None:
        _enable_cpu_fallback(value)


sys.modules[__name__].__class__ = _Module
