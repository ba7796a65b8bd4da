"""The host CPU: always available, the reference when there is no GPU."""

from __future__ import annotations

import platform

from neuron_workbench.backends.base import Availability, Backend, BackendInfo


class CpuBackend(Backend):
    """PyTorch on the host CPU, standing in for ``cuda`` when a cell's code targets CUDA.

    A cell run here is CUDA code with its devices remapped, so the CUDA parts of it get CUDA's
    semantics (copies on ``.cuda()``, CUDA's autocast lists, pinned memory, foreach optimizers, TF32
    when the cell enables it; :mod:`neuron_workbench.run.cuda_on_host`); CPU code in the cell
    (``.to("cpu")``, ``torch.autocast("cpu")``) keeps CPU semantics. Reports call it ``cpu (as cuda)``.
    """

    name = "cpu"

    def _availability_impl(self) -> Availability:
        return Availability(True)

    def _info_impl(self) -> BackendInfo:
        import torch

        return BackendInfo(
            name="cpu",
            device="cpu",
            device_name=platform.processor() or platform.machine() or "host CPU",
            details={
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "stands_in_for": "cuda",
            },
        )
