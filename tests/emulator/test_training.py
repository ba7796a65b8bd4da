"""Acceptance: unmodified CUDA-style training (device string switched to neuron) matches CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(16 * 4 * 4, 10))

    def forward(self, x):
        return self.head(self.features(x))


class Block(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * d, d)
        )

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False, is_causal=False)[0]
        return x + self.mlp(self.ln2(x))


def _cnn_batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)


def _block_batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 8, 32, generator=g), torch.randn(4, 8, 32, generator=g)


def _train(model_cls, batch, loss_fn, device, **opt_kwargs):
    # Written as one would for CUDA, with the device string switched.
    torch.manual_seed(0)
    model = model_cls().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **opt_kwargs)
    losses = []
    for step in range(3):
        x, y = batch(step)
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


MODELS = {
    "cnn": (SmallCNN, _cnn_batch, F.cross_entropy),
    "transformer_block": (Block, _block_batch, F.mse_loss),
}


@pytest.mark.parametrize("opt_kwargs", [{}, {"foreach": True}, {"fused": True}],
                         ids=["default", "foreach", "fused"])  # fmt: skip
@pytest.mark.parametrize("name", sorted(MODELS))
def test_three_adamw_steps_match_cpu(name, opt_kwargs):
    model_cls, batch, loss_fn = MODELS[name]
    cpu_losses, cpu_state = _train(model_cls, batch, loss_fn, "cpu", **opt_kwargs)
    neu_losses, neu_state = _train(model_cls, batch, loss_fn, "neuron", **opt_kwargs)
    torch.testing.assert_close(neu_losses, cpu_losses)
    assert cpu_state.keys() == neu_state.keys()
    for key in cpu_state:
        torch.testing.assert_close(neu_state[key], cpu_state[key], msg=key)
    assert cpu_losses[0] != cpu_losses[-1]  # it did train


def test_autocast_default_fp16_bf16_and_gradscaler():
    x = torch.randn(4, 8, device="neuron")
    w = torch.randn(8, 8, device="neuron")
    with torch.autocast("neuron"):
        y = x @ w
        assert y.dtype == torch.float16  # PrivateUse1 default, as on the real device
        assert torch.softmax(y, -1).dtype == torch.float32  # fp32 list
        assert (y + x).dtype == torch.float32  # promotion outside the lists
    with torch.autocast("neuron"):
        z = torch.nn.functional.linear(x, w)
    torch.testing.assert_close(z.cpu(), (x.cpu().half() @ w.cpu().t().half()), rtol=0, atol=0,
                               check_dtype=True)  # fmt: skip
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert (x @ w).dtype == torch.bfloat16
    assert (x @ w).dtype == torch.float32

    model = nn.Linear(8, 2).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron", init_scale=1024.0)
    before = model.weight.detach().cpu().clone()
    with torch.autocast("neuron"):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1024.0  # no inf/nan found: step taken, scale kept
    assert not torch.equal(before, model.weight.detach().cpu())
    with torch.autocast("neuron"), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(torch.rand(3, device="neuron"), torch.rand(3, device="neuron"))
