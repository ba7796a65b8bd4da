"""Common torch.nn modules, forward and backward on emulated neuron vs CPU (same seed, same data)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn


def _x(*shape):
    return torch.randn(*shape)


class _Loss(nn.Module):
    """Wrap a loss so the harness can call it with one input and a fixed target."""

    def __init__(self, loss, target):
        super().__init__()
        self.loss = loss
        self.register_buffer("target", target)

    def forward(self, x):
        return self.loss(x, self.target)


class _MHA(nn.Module):
    def __init__(self, mask=None):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.register_buffer("mask", mask)

    def forward(self, x):
        return self.attn(x, x, x, attn_mask=self.mask, need_weights=False)[0]


class _RNN(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        out, _ = self.rnn(x)
        return out


class _First(nn.Module):
    def __init__(self, mod):
        super().__init__()
        self.mod = mod

    def forward(self, x):
        return self.mod(x)[0]


class _Bilinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Bilinear(6, 6, 5)

    def forward(self, x):
        return self.b(x, x.flip(-1))


class _Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.dec = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.dec(x, x.flip(1))


def _cases():
    torch.manual_seed(0)
    img = (2, 3, 8, 8)
    seq = (2, 5, 16)
    causal = torch.triu(torch.full((5, 5), float("-inf")), 1)
    bool_mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    cls_target = torch.tensor([1, 0])
    return [
        ("Conv1d", nn.Conv1d(3, 4, 3, padding=1), (2, 3, 10)),
        ("Conv2d", nn.Conv2d(3, 4, 3, stride=2), img),
        ("Conv3d", nn.Conv3d(3, 4, 2), (1, 3, 4, 4, 4)),
        ("ConvTranspose1d", nn.ConvTranspose1d(3, 4, 3), (2, 3, 6)),
        ("ConvTranspose2d", nn.ConvTranspose2d(3, 4, 3, stride=2), img),
        ("ConvTranspose3d", nn.ConvTranspose3d(3, 2, 2), (1, 3, 3, 3, 3)),
        ("Linear", nn.Linear(6, 4), (3, 6)),
        ("Bilinear", _Bilinear(), (3, 6)),
        ("Embedding", nn.Embedding(10, 4), "idx"),
        ("EmbeddingBag", nn.EmbeddingBag(10, 4, mode="mean"), "bag"),
        ("RNN", _RNN(nn.RNN(6, 8, batch_first=True)), (2, 4, 6)),
        ("LSTM", _RNN(nn.LSTM(6, 8, num_layers=2, batch_first=True)), (2, 4, 6)),
        ("GRU", _RNN(nn.GRU(6, 8, batch_first=True, bidirectional=True)), (2, 4, 6)),
        ("LSTMCell", _First(nn.LSTMCell(6, 8)), (3, 6)),
        ("GRUCell", nn.GRUCell(6, 8), (3, 6)),
        ("BatchNorm1d", nn.BatchNorm1d(6), (4, 6)),
        ("BatchNorm2d", nn.BatchNorm2d(3), img),
        ("LayerNorm", nn.LayerNorm(16), seq),
        ("GroupNorm", nn.GroupNorm(1, 3), img),
        ("InstanceNorm2d", nn.InstanceNorm2d(3, affine=True), img),
        ("RMSNorm", nn.RMSNorm(16), seq),
        ("LocalResponseNorm", nn.LocalResponseNorm(2), img),
        ("MaxPool1d", nn.MaxPool1d(2), (2, 3, 8)),
        ("MaxPool2d", nn.MaxPool2d(2), img),
        ("AvgPool2d", nn.AvgPool2d(2), img),
        ("AdaptiveAvgPool2d", nn.AdaptiveAvgPool2d(1), img),
        ("AdaptiveMaxPool2d", nn.AdaptiveMaxPool2d((2, 2)), img),
        ("Upsample-nearest", nn.Upsample(scale_factor=2), img),
        ("Upsample-bilinear", nn.Upsample(scale_factor=2, mode="bilinear"), img),
        ("PixelShuffle", nn.PixelShuffle(2), (1, 8, 3, 3)),
        ("MultiheadAttention", _MHA(), seq),
        ("MultiheadAttention-causal", _MHA(causal), seq),
        ("MultiheadAttention-boolmask", _MHA(bool_mask), seq),
        (
            "TransformerEncoderLayer",
            nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True),
            seq,
        ),
        ("TransformerDecoderLayer", _Decoder(), seq),
        ("ReLU", nn.ReLU(), (3, 6)),
        ("GELU", nn.GELU(), (3, 6)),
        ("SiLU", nn.SiLU(), (3, 6)),
        ("Tanh", nn.Tanh(), (3, 6)),
        ("Sigmoid", nn.Sigmoid(), (3, 6)),
        ("LeakyReLU", nn.LeakyReLU(0.1), (3, 6)),
        ("ELU", nn.ELU(), (3, 6)),
        ("Softplus", nn.Softplus(), (3, 6)),
        ("Hardswish", nn.Hardswish(), (3, 6)),
        ("Mish", nn.Mish(), (3, 6)),
        ("PReLU", nn.PReLU(), (3, 6)),
        ("Softmax", nn.Softmax(dim=-1), (3, 6)),
        ("LogSoftmax", nn.LogSoftmax(dim=-1), (3, 6)),
        ("Dropout-eval", nn.Dropout(0.5).eval(), (3, 6)),
        ("Flatten", nn.Flatten(), img),
        ("CrossEntropyLoss", _Loss(nn.CrossEntropyLoss(label_smoothing=0.1), cls_target), (2, 5)),
        ("NLLLoss", _Loss(nn.NLLLoss(), cls_target), (2, 5)),
        ("MSELoss", _Loss(nn.MSELoss(), torch.randn(3, 6)), (3, 6)),
        ("L1Loss", _Loss(nn.L1Loss(), torch.randn(3, 6)), (3, 6)),
        ("SmoothL1Loss", _Loss(nn.SmoothL1Loss(), torch.randn(3, 6)), (3, 6)),
        ("BCEWithLogitsLoss", _Loss(nn.BCEWithLogitsLoss(), torch.rand(3, 6)), (3, 6)),
        ("KLDivLoss", _Loss(nn.KLDivLoss(reduction="batchmean"), torch.rand(3, 6)), (3, 6)),
        ("CosineSimilarity", _Loss(nn.CosineSimilarity(dim=-1), torch.randn(3, 6)), (3, 6)),
    ]


CASES = _cases()


def _inputs(spec):
    g = torch.Generator().manual_seed(1)
    if spec == "idx":
        return torch.randint(0, 10, (3, 4), generator=g), False
    if spec == "bag":
        return torch.randint(0, 10, (3, 4), generator=g), False
    return torch.randn(*spec, generator=g), True


def test_at_least_40_module_kinds():
    assert len({name.split("-")[0] for name, _, _ in CASES}) >= 40


@pytest.mark.parametrize("name,module,spec", CASES, ids=[c[0] for c in CASES])
def test_module_forward_backward_matches_cpu(name, module, spec):
    x, is_float = _inputs(spec)
    cpu_mod = copy.deepcopy(module)
    neu_mod = copy.deepcopy(module).to("neuron")
    assert all(p.device.type == "neuron" for p in neu_mod.parameters())

    xc = x.clone().requires_grad_(is_float)
    xn = x.clone().to("neuron").requires_grad_(is_float)
    torch.manual_seed(2)
    out_c = cpu_mod(xc)
    torch.manual_seed(2)
    out_n = neu_mod(xn)
    assert out_n.device.type == "neuron"
    torch.testing.assert_close(out_n.cpu(), out_c, rtol=1e-4, atol=1e-5)

    g = torch.randn(out_c.shape, generator=torch.Generator().manual_seed(3))
    (out_c * g).sum().backward()
    (out_n * g.to("neuron")).sum().backward()
    if is_float:
        torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
    for (pn, pc), (_, pnn) in zip(cpu_mod.named_parameters(), neu_mod.named_parameters()):
        assert pnn.grad is not None, pn
        torch.testing.assert_close(pnn.grad.cpu(), pc.grad, rtol=1e-4, atol=1e-5, msg=pn)
