"""NVIDIA GPUs through ``torch.cuda``: the usual reference backend on a GPU machine."""

from __future__ import annotations

from neuron_workbench.backends.base import Availability, Backend, BackendInfo, MemoryStats


class CudaBackend(Backend):
    """PyTorch's CUDA device (``cuda:0``)."""

    name = "cuda"

    def _availability_impl(self) -> Availability:
        import torch

        if not torch.backends.cuda.is_built():
            return Availability(
                False, "cuda is not available: this torch build has no CUDA support"
            )
        if not torch.cuda.is_available():
            return Availability(False, "cuda is not available: no NVIDIA GPU is visible to torch")
        return Availability(True)

    def _info_impl(self) -> BackendInfo:
        import torch

        return BackendInfo(
            name="cuda",
            device="cuda:0",
            device_name=torch.cuda.get_device_name(0),
            details={"torch": torch.__version__, "cuda": torch.version.cuda},
        )

    def _synchronize_impl(self) -> None:
        import torch

        torch.cuda.synchronize()

    def _manual_seed_impl(self, seed: int) -> None:
        import torch

        torch.cuda.manual_seed_all(seed)

    def _memory_stats_impl(self) -> MemoryStats:
        import torch

        return MemoryStats(torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated())

    def _reset_peak_memory_impl(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()
