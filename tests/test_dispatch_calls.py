"""call_op: an op called from a dispatch mode bumps the versions it would bump without one."""

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_workbench.dispatch_calls import call_op


class _Passing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return call_op(func, args, kwargs)


@pytest.mark.parametrize("implementation", ["foreach", "fused", "for-loop"])
def test_an_optimizer_step_in_a_mode_bumps_the_weights_versions_as_without_one(implementation):
    # foreach steps bump them without a mode and not under one (pytorch/pytorch#191154); fused
    # steps bump none either way (their kernels do not): a mode must not make them, or a graph
    # that saved a weight before the step fails its backward pass where a GPU runs it
    kwargs = {"foreach": implementation == "foreach", "fused": implementation == "fused"}

    def bumped(mode):
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, **kwargs)
        model(torch.randn(2, 3)).sum().backward()
        before = model.weight._version, model.bias._version
        with mode:
            opt.step()
        return model.weight._version - before[0], model.bias._version - before[1]

    plain, in_mode = bumped(contextlib.nullcontext()), bumped(_Passing())
    assert [n > 0 for n in in_mode] == [n > 0 for n in plain]
    assert all(n > 0 for n in in_mode) == (implementation != "fused")


def test_a_foreach_op_that_bumps_its_versions_is_not_bumped_again():
    tensors = [torch.zeros(2), torch.zeros(3)]
    before = [t._version for t in tensors]
    with torch.no_grad():
        call_op(torch.ops.aten._foreach_add_.Scalar, (tensors, 1.0))  # no mode: torch bumps
    assert [t._version for t in tensors] == [v + 1 for v in before]
    assert all(bool((t == 1).all()) for t in tensors)


def test_an_op_writing_no_list_is_called_as_it_is():
    x = torch.zeros(2)
    with _Passing():
        x.add_(1)
    assert x._version == 1
