"""What the %%neuron benchmarks share: a CUDA-style training-step cell and interleaved timing.

Not a benchmark itself (``run.py`` skips files starting with an underscore).
"""

from __future__ import annotations

import time
from collections.abc import Callable

SETUP = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(32 * 32 * 32, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))

torch.manual_seed(0)
initial = SmallCNN().state_dict()
"""

#: One training step written for CUDA; ``DEVICE`` is replaced by the device to run on.
CELL = """model = SmallCNN()
model.load_state_dict(initial)
model.to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
images = torch.randn(32, 3, 32, 32, device=DEVICE)
labels = torch.randint(0, 10, (32,), device=DEVICE)
optimizer.zero_grad()
loss = F.cross_entropy(model(images), labels)
loss.backward()
optimizer.step()
"""


def cell_for(device: str) -> str:
    """The training-step cell with its device spelled out (``"cuda"`` for %%neuron)."""
    return CELL.replace("DEVICE", repr(device))


def best_of_interleaved(
    baseline: Callable[[], object], candidate: Callable[[], object], rounds: int
) -> tuple[float, float]:
    """Minimum time of each, alternating rounds so machine noise hits both alike."""
    baseline(), candidate()
    base, cand = [], []
    for _ in range(rounds):
        for fn, times in ((baseline, base), (candidate, cand)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return min(base), min(cand)
