"""Shared by tests/trace: a CUDA-style model with known non-native ops on emulated neuron."""

import inspect

import torch
import torch.nn as nn


class PoolNet(nn.Module):
    """conv → MaxPool2d (falls back on neuron) → linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 7 * 7, 5)

    def forward(self, x):
        y = self.pool(self.conv(x))  # MARK: pool
        return self.fc(torch.flatten(y, 1))


# Inputs are made on the CPU and moved, so only the model's ops (not randn's) are in the record.
CELL = """model = PoolNet().to("cuda")
x = images.to("cuda")
for _ in range(2):
    logits = model(x)
loss = logits.sum()
loss.backward()
ranked = torch.sort(logits, dim=1)
ranked = torch.sort(logits, dim=0)
ranked = torch.sort(logits, dim=1)
"""
CELL_SORT_LINES = [7, 8, 9]
CELL_FORWARD_LINE = 4

#: Exactly the ops of CELL that emulated neuron runs on the CPU.
EXPECTED_FALLBACKS = {
    "aten::max_pool2d_with_indices": 2,
    "aten::max_pool2d_with_indices_backward": 1,
    "aten::sort": 3,
}


def pool_line() -> int:
    lines, start = inspect.getsourcelines(PoolNet.forward)
    return start + next(i for i, text in enumerate(lines) if "MARK: pool" in text)


def make_namespace():
    torch.manual_seed(0)
    return {
        "__name__": "__main__",
        "torch": torch,
        "PoolNet": PoolNet,
        "images": torch.randn(2, 3, 16, 16),
    }
