import importlib.util

import pytest
import torch

# Fixture notebooks are inputs of tests (the scanner's), not guided notebooks for nbval to run.
collect_ignore_glob = ["**/fixtures/*", "**/fixtures/**/*"]


def _real_backend(name: str) -> bool:
    return importlib.util.find_spec(f"torch_{'neuronx' if name == 'neuron' else name}") is not None


def pytest_collection_modifyitems(config, items):
    skips = {
        "cuda": (not torch.cuda.is_available(), "needs a CUDA GPU"),
        "neuron": (not _real_backend("neuron"), "needs Trainium with torch-neuronx"),
        "tpu": (not _real_backend("tpu"), "needs a TPU with torch-tpu"),
    }
    for item in items:
        for marker, (skip, why) in skips.items():
            if skip and item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session", autouse=True)
def emulated_neuron():
    """The test process emulates ``neuron`` (one PrivateUse1 backend per process; tpu tests use
    subprocesses)."""
    from neuron_workbench import emulate

    return emulate("neuron")


@pytest.fixture
def ip():
    """A real IPython shell with neuron_workbench loaded and a fresh namespace."""
    from neuron_workbench.testing import testing_shell

    shell = testing_shell()
    yield shell
    shell.reset(new_session=False)
