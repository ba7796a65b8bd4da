"""Recurrent layers on the device path: same results as PyTorch's own, fused cells rounded once."""

import pytest
import torch

from neuron_workbench.cuda_semantics.rnn import device_path, fused_lstm_cell


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_device_path_matches_pytorch_in_float32(kind, bidirectional):
    torch.manual_seed(0)
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    rnn = cls(6, 5, num_layers=2, batch_first=True, bidirectional=bidirectional)
    x = torch.randn(3, 7, 6, requires_grad=True)
    expected = rnn(x)
    calls = []
    original = torch.lstm if kind == "lstm" else torch.gru

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is original:
                run = device_path(func, args)
                assert run is not None
                calls.append(func)
                return run()
            return func(*args, **(kwargs or {}))

    with Spy():
        got = rnn(x)
    assert calls == [original]
    out, hidden = got
    torch.testing.assert_close(out, expected[0])
    for a, b in zip(
        hidden if kind == "lstm" else [hidden], expected[1] if kind == "lstm" else [expected[1]]
    ):
        torch.testing.assert_close(a, b)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_projections_keep_pytorchs_path():
    # padded and packed forms alike: an LSTM with proj_size has a weight more per layer
    lstm = torch.nn.LSTM(4, 3, proj_size=2)
    params = list(lstm._flat_weights)
    args = (
        torch.randn(2, 1, 4),
        [torch.zeros(1, 1, 2), torch.zeros(1, 1, 3)],
        params,
        True,
        1,
        0.0,
        False,
        False,
        False,
    )
    assert device_path(torch.lstm, args) is None
    packed_args = (
        torch.randn(2, 4),
        torch.tensor([1, 1]),
        [torch.zeros(1, 1, 3)] * 2,
        params,
        True,
        1,
        0.0,
        False,
        False,
    )
    assert device_path(torch.lstm, packed_args) is None


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_device_path_matches_pytorch_in_float32(kind, bidirectional):
    # sequences of several lengths: forward, one that ended keeps its state; backward, each starts
    # from its own initial state
    torch.manual_seed(0)
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    rnn = cls(5, 6, num_layers=2, bidirectional=bidirectional)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.randn(7, 4, 5), torch.tensor([7, 5, 5, 2])
    )
    initial = torch.randn(2 * (2 if bidirectional else 1), 4, 6)
    hx = (initial, torch.randn_like(initial)) if kind == "lstm" else initial
    args = (
        packed.data,
        packed.batch_sizes,
        hx,
        rnn._flat_weights,
        True,
        2,
        0.0,
        False,
        bidirectional,
    )
    func = torch.lstm if kind == "lstm" else torch.gru
    run = device_path(func, args)
    assert run is not None
    for got, expected in zip(run(), func(*args), strict=True):
        torch.testing.assert_close(got, expected)


def test_fused_cell_rounds_bfloat16_once():
    torch.manual_seed(0)
    ig, hg = torch.randn(4, 16).bfloat16(), torch.randn(4, 16).bfloat16()
    cx = torch.randn(4, 4).bfloat16()
    hy, cy, _ = fused_lstm_cell(ig, hg, cx)
    gates = ig.float() + hg.float()
    i, f, g, o = gates.chunk(4, 1)
    c = f.sigmoid() * cx.float() + i.sigmoid() * g.tanh()
    assert hy.dtype == cy.dtype == torch.bfloat16
    assert torch.equal(cy, c.bfloat16())
    assert torch.equal(hy, (o.sigmoid() * c.tanh()).bfloat16())
