"""%%neuron on a training-step cell vs running that cell twice with no workbench.

Two figures:
- cpu/cpu: ``%%neuron --ref cpu --target cpu`` against two plain runs on the CPU. Everything the
  workbench adds (isolation copies, CUDA remapping, fallback recording, capture, comparison, report)
  and nothing else. Goal: at most 1.3x.
- cpu/neuron: ``%%neuron --ref cpu --target neuron`` against one plain CPU run plus one plain run on
  the emulated device (the code written with device="neuron"), so the emulator's own cost is in the
  baseline too.
Each figure is the minimum over rounds, after a warm-up round.
"""

from __future__ import annotations

import time

import torch

from neuron_workbench import emulate

emulate("neuron")  # before any backward pass in this process

from neuron_workbench.testing import run_cell, testing_shell  # noqa: E402

ROUNDS = 7
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


def best_of_interleaved(baseline, candidate) -> tuple[float, float]:
    """Minimum time of each, alternating rounds so machine noise hits both alike."""
    baseline(), candidate()
    base, cand = [], []
    for _ in range(ROUNDS):
        for fn, times in ((baseline, base), (candidate, cand)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return min(base), min(cand)


def main() -> None:
    torch.set_num_threads(1)
    shell = testing_shell()
    shell.display_pub.publish = lambda *a, **k: None  # measure the work, not the terminal printing
    run_cell(shell, SETUP)

    def plain(device: str) -> None:
        run_cell(shell, CELL.replace("DEVICE", repr(device)))

    def magic(target: str) -> None:
        run_cell(shell, f"%%neuron --ref cpu --target {target}\n" + CELL.replace("DEVICE", '"cuda"'))

    baseline_cpu, magic_cpu = best_of_interleaved(
        lambda: (plain("cpu"), plain("cpu")), lambda: magic("cpu")
    )
    baseline_mixed, magic_neuron = best_of_interleaved(
        lambda: (plain("cpu"), plain("neuron")), lambda: magic("neuron")
    )
    print(f"magic overhead, cpu vs cpu:    {magic_cpu / baseline_cpu:.2f}x "
          f"(%%neuron {magic_cpu * 1e3:.1f} ms vs two plain runs {baseline_cpu * 1e3:.1f} ms; goal <= 1.3x)")
    print(f"magic overhead, neuron vs cpu: {magic_neuron / baseline_mixed:.2f}x "
          f"(%%neuron {magic_neuron * 1e3:.1f} ms vs plain cpu + plain emulated neuron "
          f"{baseline_mixed * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
