"""Fingerprints of random draws: equal for equal numbers, different otherwise, never profiled."""

import torch

from neuron_workbench.run.random_draws import (
    FINGERPRINT_LENGTH,
    draws_on_device,
    fingerprint,
    original_function,
)


def test_fingerprint_keeps_shape_and_leading_numbers():
    torch.manual_seed(0)
    a = torch.randn(4, 5)
    torch.manual_seed(0)
    b = torch.randn(4, 5)
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a)[0] == (4, 5) and len(fingerprint(a)) == 1 + FINGERPRINT_LENGTH
    assert fingerprint(a) != fingerprint(torch.randn(4, 5))


def test_dropout_fingerprint_is_where_the_zeros_are():
    x = torch.tensor([0.0, 2.0, 0.0, 3.0])
    assert fingerprint(x, zeros_only=True) == ((4,), True, False, True, False)
    assert fingerprint("not a tensor") == ()


def test_device_draws_are_told_by_device_or_by_the_cuda_name():
    def on_device(t):
        return t.device.type != "cpu"

    # what the dispatcher reports (the emulator wraps torch.randn for pinned memory)
    randn = original_function(torch.randn)
    assert not draws_on_device(randn, (3,), {"device": "cpu"}, on_device)
    # on the host standing in for cuda the device argument already reads "cpu"
    assert draws_on_device(randn, (3,), {"device": "cpu"}, on_device, named_cuda=True)
    assert not draws_on_device(torch.Tensor.normal_, (torch.ones(2),), {}, on_device)
