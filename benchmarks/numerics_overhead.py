"""Numerics figures, each a ratio against a baseline measured in the same run.

- comparator vs ``torch.testing.assert_close`` on two 1e8-element float32 tensors that differ by
  noise within tolerance (goal: at most 0.5x the time). ``assert_close`` only decides; the
  workbench also measures max/mean error, RMSE, cosine, SNR and the tightest passing tolerance.
- ``%%neuron --layers`` vs plain ``%%neuron`` on a 50-module model (goal: at most 1.3x).
"""

from __future__ import annotations

import gc
import time

import torch

from neuron_workbench import emulate

emulate("neuron")  # before any backward pass in this process

from neuron_workbench.compare import compare_outputs  # noqa: E402
from neuron_workbench.testing import run_cell, testing_shell  # noqa: E402

ELEMENTS = 100_000_000
ROUNDS = 5


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def comparator() -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(ELEMENTS, generator=g)
    target = ref + 1e-7 * torch.randn(ELEMENTS, generator=g)

    def baseline() -> None:
        torch.testing.assert_close(target, ref)

    def ours() -> None:
        assert compare_outputs({"x": ref}, {"x": target}).passed

    base, cand = [], []
    for _ in range(2):  # 2 rounds: each call walks 800 MB
        base.append(timed(baseline))
        gc.collect()
        cand.append(timed(ours))
        gc.collect()
    print(
        f"comparator vs assert_close, 1e8 fp32: {min(cand) / min(base):.2f}x "
        f"({min(cand):.2f} s vs {min(base):.2f} s; goal <= 0.5x)"
    )


SETUP = """
import torch
import torch.nn as nn
torch.manual_seed(0)
blocks = []
for _ in range(25):
    blocks += [nn.Linear(256, 256), nn.ReLU()]
deep = nn.Sequential(*blocks)          # 50 modules (+ the container)
batch = torch.randn(64, 256)
"""
CELL = "out = deep.to('cuda')(batch.to('cuda'))\n"


def layers() -> None:
    torch.set_num_threads(1)
    shell = testing_shell()
    shell.display_pub.publish = lambda *a, **k: None
    run_cell(shell, SETUP)

    def plain() -> None:
        run_cell(shell, "%%neuron --ref cpu --target neuron --no-scan\n" + CELL)

    def with_layers() -> None:
        run_cell(shell, "%%neuron --ref cpu --target neuron --no-scan --layers\n" + CELL)

    plain(), with_layers()
    base, cand = [], []
    for _ in range(ROUNDS):
        base.append(timed(plain))
        cand.append(timed(with_layers))
    print(
        f"--layers vs plain %%neuron, 50 modules: {min(cand) / min(base):.2f}x "
        f"({min(cand) * 1e3:.1f} ms vs {min(base) * 1e3:.1f} ms; goal <= 1.3x)"
    )


if __name__ == "__main__":
    comparator()
    layers()
