"""Emulator overhead vs plain CPU: a small CNN, a transformer block, and GPT training loops.

The GPT figures are the ones laptop users see first: a 2-layer GPT (64-dim, 32 tokens, batch 4,
4-step gradient accumulation, AdamW) and a 4-layer GPT (256-dim, 128 tokens, batch 8), both
``transformers``' GPT-2 built from a config. Goals (issue: emulator core): small GPT <= 1.5x,
4-layer GPT <= 1.05x, CNN and transformer block <= 1.25x.

It also measures the emulator's fixed cost per dispatched op: a loop of tiny ops (add, in-place
add, sum, a small matmul) on both devices; the difference per op is the overhead in microseconds.

Run: ``PYTHONPATH=workbench .venv/bin/python benchmarks/emulator_overhead.py [--threads 1]``.
Both configurations run in the same process, interleaved, and each figure is the minimum over
rounds of several steps (the machine may be shared and noisy). Emulated timings are host CPU time.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(32 * 8 * 8, 10))

    def forward(self, x):
        return self.head(self.features(x))


class Block(nn.Module):
    def __init__(self, d: int = 128, heads: int = 4) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def make_cnn(device):
    torch.manual_seed(0)
    model = SmallCNN().to(device)
    x = torch.randn(32, 3, 32, 32).to(device)
    y = torch.randint(0, 10, (32,)).to(device)

    def step():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()

    return step


def make_block(device):
    torch.manual_seed(0)
    model = Block().to(device)
    x = torch.randn(16, 32, 128).to(device)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()

    return step


def _gpt(device, layers: int, dim: int, tokens: int, batch: int, accumulate: int):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256, n_positions=tokens, n_embd=dim, n_layer=layers, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (accumulate, batch, tokens)).to(device)

    def step():
        for micro in range(accumulate):
            loss = model(input_ids=ids[micro], labels=ids[micro]).loss / accumulate
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def make_small_gpt(device):
    return _gpt(device, layers=2, dim=64, tokens=32, batch=4, accumulate=4)


def make_gpt4(device):
    return _gpt(device, layers=4, dim=256, tokens=128, batch=8, accumulate=1)


def per_op_overhead_us(device: str, calls: int = 20000) -> float:
    """Mean time per tiny op on ``device`` in microseconds (a mix of four common ops)."""
    x = torch.randn(8, device=device)
    y = torch.randn(8, device=device)
    a = torch.randn(4, 4, device=device)
    ops = (lambda: x + y, lambda: x.add_(y), lambda: x.sum(), lambda: a @ a)
    for op in ops:
        op()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls // len(ops)):
            for op in ops:
                op()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def bench(step, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from neuron_workbench.emulator import emulate

    st = emulate("neuron")
    results = {}
    cpu_us, emu_us = per_op_overhead_us("cpu"), per_op_overhead_us("neuron")
    results["per_op"] = {"cpu_us": cpu_us, "emulated_us": emu_us, "overhead_us": emu_us - cpu_us}
    print(
        f"per op (tiny ops)  cpu {cpu_us:6.2f} us  emulated {emu_us:6.2f} us  "
        f"overhead {emu_us - cpu_us:.2f} us  ({st.core} core)"
    )
    workloads = (
        ("cnn", make_cnn, args.steps),
        ("transformer_block", make_block, args.steps),
        ("small_gpt_train", make_small_gpt, args.steps),
        ("gpt_4layer_train", make_gpt4, 1),
    )
    for name, make, steps in workloads:
        cpu, emu = make("cpu"), make("neuron")
        for s in (cpu, emu):  # warm up
            bench(s, 3)
        best_cpu = best_emu = float("inf")
        for _ in range(args.rounds):
            best_cpu = min(best_cpu, bench(cpu, steps))
            best_emu = min(best_emu, bench(emu, steps))
        results[name] = {
            "cpu_ms": best_cpu * 1e3,
            "emulated_ms": best_emu * 1e3,
            "ratio": best_emu / best_cpu,
        }
        print(
            f"{name:18s} cpu {best_cpu * 1e3:7.2f} ms  {st.describe()} {best_emu * 1e3:7.2f} ms"
            f"  ratio {best_emu / best_cpu:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"threads": args.threads, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
