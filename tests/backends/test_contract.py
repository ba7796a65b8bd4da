"""One contract for every backend adapter that can run here."""

import pytest
import torch

from neuron_workbench.backends import BACKEND_NAMES, Availability, MemoryStats, get_backend
from neuron_workbench.backends.registry import BackendStatusTable, default_reference
from neuron_workbench.errors import BackendUnavailable, WorkbenchUsageError


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_availability_is_explained(name):
    avail = get_backend(name).availability()
    assert isinstance(avail, Availability)
    if not avail:
        assert avail.reason.startswith(f"{name} is not available") or name in avail.reason


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_available_backend_runs_tensors_on_its_device(name):
    backend = get_backend(name)
    if not backend.availability():
        with pytest.raises(BackendUnavailable):
            with backend.activated():
                pass
        return
    with backend.activated():
        x = torch.ones(3, device=backend.device) * 2
        backend.synchronize()
        assert x.device.type == backend.device_type
        info = backend.info()
        assert info.name == name and info.device.startswith(backend.device_type)
        assert info.emulated == backend.availability().emulated
        stats = backend.memory_stats()
        assert isinstance(stats, MemoryStats)
        backend.reset_peak_memory()
        backend.manual_seed(3)
        a = torch.rand(2, device=backend.device)
        backend.manual_seed(3)
        assert torch.equal(a.cpu(), torch.rand(2, device=backend.device).cpu())


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(WorkbenchUsageError, match="cpu, cuda, neuron, tpu"):
        get_backend("xla")


def test_default_reference_is_cuda_only_with_a_gpu():
    assert default_reference() == ("cuda" if torch.cuda.is_available() else "cpu")


def test_status_table_lines():
    lines = BackendStatusTable().lines()
    assert [line.split()[0] for line in lines] == list(BACKEND_NAMES)


def test_emulated_neuron_memory_is_accounted():
    backend = get_backend("neuron")
    with backend.activated():
        backend.reset_peak_memory()
        base = backend.memory_stats().current_bytes
        block = torch.zeros(1024, 256, device="neuron")  # 1 MiB of float32
        stats = backend.memory_stats()
        assert stats.current_bytes - base >= 1024 * 256 * 4
        assert stats.peak_bytes >= stats.current_bytes
        del block


@pytest.mark.cuda
def test_cuda_backend_on_a_gpu():
    backend = get_backend("cuda")
    with backend.activated():
        assert "cuda" in backend.info().device
