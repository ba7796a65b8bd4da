"""Each run's own copy of the notebook state: what the copy keeps of parameters."""

import torch

from neuron_workbench.run.namespace import isolate


def _trained(module: torch.nn.Module) -> torch.nn.Module:
    module(torch.ones(2, module[0].in_features)).sum().backward()
    return module


def test_a_parameter_keeps_its_gradient_and_attributes():
    model = _trained(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)))
    model[0].weight.note = "frozen later"
    copies, shared = isolate({"model": model}, ["model"])
    assert shared == []
    copied = copies["model"][0].weight
    assert copied is not model[0].weight
    assert isinstance(copied, torch.nn.Parameter) and copied.requires_grad
    assert torch.equal(copied.grad, model[0].weight.grad)
    assert copied.grad.data_ptr() != model[0].weight.grad.data_ptr()
    assert copied.note == "frozen later"


def test_many_parameters_copy_to_their_own_values():
    # Each parameter's .data is a temporary object: its id, a deepcopy memo key, must not be
    # reused by the next parameter's (a model of many layers got another layer's weights).
    layers = [torch.nn.Linear(i + 1, i + 2) for i in range(40)]
    model = torch.nn.Sequential(*layers)
    copies, _ = isolate({"model": model}, ["model"])
    for original, copied in zip(model.parameters(), copies["model"].parameters()):
        assert copied.shape == original.shape
        assert torch.equal(copied, original)


def test_a_view_of_a_parameter_stays_a_view_of_the_copy():
    lin = torch.nn.Linear(3, 2)
    rows = lin.weight.detach()[:1]
    copies, _ = isolate({"lin": lin, "rows": rows}, ["lin", "rows"])
    with torch.no_grad():
        copies["lin"].weight.zero_()
    assert torch.count_nonzero(copies["rows"]) == 0
    assert torch.count_nonzero(rows) > 0  # the notebook's own tensors are untouched


def test_parameter_deepcopy_is_pytorchs_own_outside_a_run():
    lin = _trained(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    isolate({"lin": lin}, ["lin"])
    import copy

    assert copy.deepcopy(lin)[0].weight.grad is None  # PyTorch's behaviour, restored
