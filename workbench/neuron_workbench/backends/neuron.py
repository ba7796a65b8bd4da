"""AWS Trainium through TorchNeuron (device ``neuron``), or the emulated ``neuron`` device.

On the real backend the adapter follows ``shared/notes/torchneuron.md``: ``torch.neuron`` memory,
seed and synchronize calls (§4, §9), and CPU fallbacks from the op-tracking API
(``clear_op_tracking`` / ``get_fallback_ops``, §6.3), which gives unique op names only; a dispatch
recorder adds how often each op was called and from which line (§14.1).

Ops that fall back inside another op's kernel (``normal_`` inside ``randn``) never reach the
recorder under their own name, so by default they are listed without a count or line. With
per-op tracking (``get_backend("neuron", track_per_op=True)`` or
``NEURON_WORKBENCH_NEURON_TRACK_PER_OP=1``) the adapter clears the op tracking before every op and
reads it after a synchronize, which attributes every fallback to the call that caused it, at the
cost of a synchronize per op (execution is asynchronous, and whether 2.33 launches blocking by
default is not known).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

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

#: Environment variable that turns per-op fallback tracking on.
TRACK_PER_OP_ENV = "NEURON_WORKBENCH_NEURON_TRACK_PER_OP"


class NeuronBackend(AcceleratorBackend):
    """TorchNeuron's ``neuron`` device; emulated when ``torch_neuronx`` is not loaded."""

    name = "neuron"
    sdk_module = "torch_neuronx"
    sdk_distribution = "torch-neuronx"
    documented_calls = _DOCUMENTED

    def __init__(self, track_per_op: bool | None = None) -> None:
        if track_per_op is None:
            flag = os.environ.get(TRACK_PER_OP_ENV, "").strip().lower()
            track_per_op = flag in ("1", "true", "yes", "on")
        self.track_per_op = bool(track_per_op)

    def options(self) -> dict[str, Any]:
        """``{"track_per_op": ...}`` (see :meth:`Backend.options`)."""
        return {"track_per_op": self.track_per_op}

    def _extra_details(self) -> dict[str, Any]:
        # Only the non-default mode is named, so default reports read as before.
        if not self.track_per_op or self.is_emulated():
            return {}
        return {"fallback_tracking": "per op (op tracking read after a synchronize per op)"}

    def _fallback_tracking_how(self) -> str:
        sdk = self.sdk()
        if sdk is None or not all(callable(getattr(sdk, n, None)) for n in _TRACKING):
            return f"{NOT_AVAILABLE} (torch_neuronx has no get_fallback_ops/clear_op_tracking)"
        if self.track_per_op:
            return (
                "torch_neuronx.get_fallback_ops read per op (counts, sites; a synchronize per op)"
            )
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
        per_call = None
        if self.track_per_op:

            def read() -> list[str]:
                self._device_call("synchronize")
                return list(sdk.get_fallback_ops())

            per_call = (sdk.clear_op_tracking, read)
        recorder = DispatchCallRecorder(per_call=per_call)
        try:
            with recorder.recording():
                yield
        finally:
            self._device_call("synchronize")
            names = recorder.named | {str(n) for n in sdk.get_fallback_ops()}
            source = "torch_neuronx.get_fallback_ops + dispatch recorder"
            if self.track_per_op:
                source = "torch_neuronx.get_fallback_ops per op"
            recording.events = recorder.events_for(sorted(names), source=source)
