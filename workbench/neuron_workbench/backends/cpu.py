"""The host CPU: always available, the reference when there is no GPU."""

from __future__ import annotations

import platform

from neuron_workbench.backends.base import Availability, Backend, BackendInfo


class CpuBackend(Backend):
    """Plain PyTorch on the host CPU."""

    name = "cpu"

    def _availability_impl(self) -> Availability:
        return Availability(True)

    def _info_impl(self) -> BackendInfo:
        import torch

        return BackendInfo(
            name="cpu",
            device="cpu",
            device_name=platform.processor() or platform.machine() or "host CPU",
            details={"torch": torch.__version__, "threads": torch.get_num_threads()},
        )
