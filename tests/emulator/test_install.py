"""Installing the emulated device: the device methods are generated once, errors are not swallowed."""

import pytest
import torch

from neuron_workbench.emulator import _install


@pytest.fixture
def generate_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(
        torch.utils, "generate_methods_for_privateuse1_backend", lambda **kw: calls.append(kw)
    )
    return calls


def test_emulated_device_has_its_generated_methods():
    x = torch.ones(2).neuron()
    assert x.is_neuron and x.device.type == "neuron"
    assert next(torch.nn.Linear(2, 2).neuron().parameters()).is_neuron
    packed = torch.nn.utils.rnn.pack_sequence([torch.ones(2, 1)]).neuron()
    assert packed.is_neuron


def test_a_second_install_does_not_ask_torch_again(generate_calls):
    methods = (
        torch.Tensor.neuron,
        torch.nn.Module.neuron,
        torch.nn.utils.rnn.PackedSequence.neuron,
    )
    _install._generate_device_methods("neuron")
    assert generate_calls == []
    assert methods == (
        torch.Tensor.neuron,
        torch.nn.Module.neuron,
        torch.nn.utils.rnn.PackedSequence.neuron,
    )


def test_only_the_missing_methods_are_generated(generate_calls, monkeypatch):
    monkeypatch.delattr(torch.nn.Module, "neuron")
    _install._generate_device_methods("neuron")
    assert generate_calls == [
        {
            "for_storage": False,
            "for_tensor": False,
            "for_module": True,
            "for_packed_sequence": False,
        }
    ]


def test_an_error_from_torch_is_raised_not_swallowed(monkeypatch):
    def refuse(**kw):
        raise RuntimeError("cannot generate methods")

    monkeypatch.setattr(torch.utils, "generate_methods_for_privateuse1_backend", refuse)
    with pytest.raises(RuntimeError, match="cannot generate methods"):
        _install._generate_device_methods("neverinstalled")
