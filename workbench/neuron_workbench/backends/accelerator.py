"""Shared adapter for PrivateUse1 accelerators (``neuron``, ``tpu``): real SDK or the emulator.

With the vendor's backend loaded (``torch_neuronx`` / ``torch_tpu`` autoload at ``import torch`` on
hardware), the real device is used. Otherwise the workbench's emulated device is installed on first
use, and every report labels it as emulated.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

from neuron_workbench.backends.base import (
    Availability,
    Backend,
    BackendInfo,
    FallbackRecording,
    MemoryStats,
)

_BACKWARD_PROBED: dict[str, str] = {}


def _check_emulated_backward(device_type: str) -> None:
    """Fail clearly if autograd cannot reach the emulated device in this process.

    PyTorch's autograd engine sizes its per-device queues once, at the first backward pass of the
    process. If that happened before the emulator registered its device, every backward on it trips
    an internal assert; the only cure is a fresh process with the emulator installed first.
    """
    if device_type not in _BACKWARD_PROBED:
        import torch

        from neuron_workbench.errors import BackendUnavailable

        probe = torch.ones(1, device=device_type, requires_grad=True)
        try:
            (probe * 2).sum().backward()
            _BACKWARD_PROBED[device_type] = ""
        except RuntimeError as exc:
            if "device_ready_queues_" not in str(exc):
                raise
            _BACKWARD_PROBED[device_type] = (
                f"emulated {device_type} cannot run backward passes in this process: autograd "
                "started before the emulator was installed. Restart the kernel and run "
                "`%load_ext neuron_workbench` (or set NEURON_WORKBENCH_EMULATE) before any "
                "training code"
            )
            raise BackendUnavailable(_BACKWARD_PROBED[device_type]) from None
    if _BACKWARD_PROBED[device_type]:
        from neuron_workbench.errors import BackendUnavailable

        raise BackendUnavailable(_BACKWARD_PROBED[device_type])


class AcceleratorBackend(Backend):
    """A PrivateUse1 device that is either real (vendor SDK) or emulated (pure Python)."""

    #: Import name of the vendor's PyTorch backend package.
    sdk_module: str = ""

    def _real_backend_loaded(self) -> bool:
        """True when the vendor backend, not our emulator, owns PrivateUse1 as this device."""
        import torch

        if torch._C._get_privateuse1_backend_name() != self.name:
            return False
        from neuron_workbench import emulator

        status = emulator.status()
        return status is None or status.device != self.name

    def is_emulated(self) -> bool:
        """Whether runs on this backend go to the emulated device."""
        return not self._real_backend_loaded()

    def _availability_impl(self) -> Availability:
        if self._real_backend_loaded():
            import torch

            module = getattr(torch, self.name, None)
            if module is not None and module.is_available():
                return Availability(True)
            return Availability(
                False,
                f"{self.name} is not available: {self.sdk_module} is loaded but sees no device",
            )
        from neuron_workbench import emulator

        ok, reason = emulator.can_emulate(self.name)
        if ok:
            return Availability(True, emulated=True)
        return Availability(False, reason)

    def _activate_impl(self) -> None:
        if self.is_emulated():
            from neuron_workbench import emulator

            emulator.emulate(self.name)
            _check_emulated_backward(self.name)

    def _device_module(self) -> Any:
        import torch

        return getattr(torch, self.name)

    def _info_impl(self) -> BackendInfo:
        import torch

        if self.is_emulated():
            from neuron_workbench import emulator

            status = emulator.status()
            details: dict[str, Any] = {"torch": torch.__version__}
            if status is not None:
                details.update(
                    profile=status.profile,
                    provenance=status.provenance,
                    native_ops=status.native_ops,
                    cpu_fallback=status.cpu_fallback,
                    numerics=dict(status.numerics),
                    timings="host CPU time",
                )
            return BackendInfo(
                name=self.name,
                device=f"{self.name}:0",
                device_name=f"emulated {self.name} (host CPU)",
                emulated=True,
                details=details,
            )
        module = self._device_module()
        sdk = importlib.util.find_spec(self.sdk_module)
        version = ""
        if sdk is not None:
            from importlib.metadata import PackageNotFoundError
            from importlib.metadata import version as dist_version

            with contextlib.suppress(PackageNotFoundError):
                version = dist_version(self.sdk_module.replace("_", "-"))
        name = getattr(module, "get_device_name", lambda *a: f"{self.name}:0")(0)
        return BackendInfo(
            name=self.name,
            device=f"{self.name}:0",
            device_name=str(name),
            details={"torch": torch.__version__, self.sdk_module: version},
        )

    def _synchronize_impl(self) -> None:
        self._device_module().synchronize()

    def _manual_seed_impl(self, seed: int) -> None:
        # The emulator shares the host generator; a real device has its own.
        if not self.is_emulated():
            self._device_module().manual_seed_all(seed)

    def _memory_stats_impl(self) -> MemoryStats:
        module = self._device_module()
        try:
            return MemoryStats(int(module.memory_allocated()), int(module.max_memory_allocated()))
        except (AttributeError, RuntimeError):
            return MemoryStats()

    def _reset_peak_memory_impl(self) -> None:
        with contextlib.suppress(AttributeError, RuntimeError):
            self._device_module().reset_peak_memory_stats()

    @contextlib.contextmanager
    def fallback_recording(self) -> Iterator[FallbackRecording]:  # type: ignore[override]
        """Record CPU fallbacks: the emulator's events, or the vendor's op tracking."""
        recording = FallbackRecording()
        if self.is_emulated():
            from neuron_workbench import emulator

            with emulator.record_fallbacks() as log:
                try:
                    yield recording
                finally:
                    recording.events = [event.to_dict() for event in log.events]
            return
        with self._real_fallback_tracking(recording):
            yield recording

    @contextlib.contextmanager
    def _real_fallback_tracking(self, recording: FallbackRecording) -> Iterator[None]:
        """Vendor op tracking; the base has none, so nothing is recorded."""
        yield
