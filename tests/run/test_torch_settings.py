"""Torch settings earlier cells changed travel with each run request and are taken there."""

import pytest
import torch

from neuron_workbench.run import torch_settings


@pytest.fixture
def restored():
    before = torch_settings.current()
    yield
    torch_settings.apply(before)


def test_settings_taken_in_another_state_come_back_as_they_were(restored):
    defaults = torch_settings.current()
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = True
    torch.set_printoptions(precision=2, sci_mode=False)
    changed = torch_settings.current()
    assert changed != defaults
    torch_settings.apply(defaults)
    assert torch_settings.current() == defaults
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    torch_settings.apply(changed)
    assert torch_settings.current() == changed
    assert torch.tensor([0.5]).dtype == torch.float64
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cuda.matmul.allow_tf32  # precision "high" is TF32 matmuls
    assert str(torch.tensor([1.23456])) == "tensor([1.23])"


def test_nothing_to_take_changes_nothing(restored):
    before = torch_settings.current()
    torch_settings.apply(None)
    torch_settings.apply({})
    assert torch_settings.current() == before
