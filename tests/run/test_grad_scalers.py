"""A GradScaler's copy makes the scale its own pickling dropped, where it is first needed."""

import copy

import torch

from neuron_workbench.run.grad_scalers import (
    SCALE_DROPPED,
    deepcopy_grad_scaler,
    grad_scaler_state,
    scales_made_again,
)


def _scaled():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones(()))  # makes its scale on the CPU
    return scaler


def test_only_a_dropped_scale_is_marked():
    assert grad_scaler_state(_scaled())[SCALE_DROPPED] is True
    assert SCALE_DROPPED not in grad_scaler_state(torch.amp.GradScaler("cpu"))


def test_a_marked_copy_steps_with_the_scale_it_had():
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=1.0)
    param.grad = torch.full((2,), 8.0)
    scaler = deepcopy_grad_scaler(_scaled(), {})
    assert scaler._scale is None
    with scales_made_again():
        scaler.step(opt)
        scaler.update()
    torch.testing.assert_close(param.detach(), torch.zeros(2))  # 1 - 8 / 8
    assert SCALE_DROPPED not in vars(scaler)
    assert copy.deepcopy(scaler)._scale is None  # PyTorch's own copy, outside the workbench's
