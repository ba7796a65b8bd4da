"""FAKE ``torch_tpu._loader``: ``load`` is the ``torch.backends`` autoload entry point."""

from __future__ import annotations

import os
import sys
import time
import types
from typing import Any

import fake_sdk_support as _support

_loaded = False


def get_tpu_device_count() -> int:
    """Fake hardware detection: ``FAKE_TORCH_TPU_DEVICES`` (default 1)."""
    return int(os.environ.get("FAKE_TORCH_TPU_DEVICES", "1"))


def _absl_warning(message: str) -> bytes:
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.gmtime(now))
    micros = int((now % 1) * 1e6)
    return f"W{stamp}.{micros:06d} {os.getpid():>7} fake_torch_tpu] {message}\n".encode()


def load() -> None:
    """Register the ``tpu`` device when hardware is detected (idempotent)."""
    global _loaded
    if _loaded or get_tpu_device_count() < 1:
        return
    _loaded = True
    from neuron_workbench.emulator import _core, device_module, events

    _support.install_device("tpu", cpu_fallback=False, narrow_64bit=False, matmul_passes=1)
    # TorchTPU warns from C++ on every fallback call, on descriptor 2 (not sys.stderr).
    _core.TPU_WARN_EVERY_CALL = False
    record_event = events.record_event

    def record_and_warn(op: str, overload: str, args: Any, seconds: float, warning: Any = None):
        message = f"operator '{overload}' is not implemented for TPU. Falling back to CPU"
        os.write(2, _absl_warning(message))
        return record_event(op, overload, args, seconds, None)

    events.record_event = record_and_warn
    module = types.ModuleType("torch.tpu")
    module.__doc__ = "fake torch.tpu (torch_tpu 0.2.0+fake)"
    module.Precision = device_module._Precision
    module.precision = device_module._precision
    _support.replace_device_module("tpu", module)
    sys.stderr.write("Successfully renamed PrivateUse1 backend to 'tpu' (fake torch_tpu)\n")
