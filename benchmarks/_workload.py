"""What the %%neuron benchmarks share: a CUDA-style training-step cell and interleaved timing.

Not a benchmark itself (``run.py`` skips files starting with an underscore).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

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


def quiet_shell(setup: str) -> Any:
    """A testing IPython shell that has run ``setup``; what cells display is not printed.

    A benchmark measures the work, not the terminal printing.
    """
    from neuron_workbench.testing import run_cell, testing_shell

    shell = testing_shell()
    shell.display_pub.publish = lambda *a, **k: None
    run_cell(shell, setup)
    return shell


def result_in_fresh_process(
    script: str, args: Sequence[str], mark: str, env: dict[str, str] | None = None
) -> Any:
    """Run ``script`` with ``args`` in a fresh Python process; the JSON it printed after ``mark``.

    The last line starting with ``mark`` counts; a failed process, or one that printed no such
    line, raises with what it wrote to stderr.
    """
    done = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, env=env, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(mark)]
    if done.returncode or not lines:
        raise RuntimeError(
            f"{script} {' '.join(args)} exited {done.returncode} without a result:\n{done.stderr}"
        )
    return json.loads(lines[-1][len(mark) :])


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


def gpt_setup(
    *, vocab: int, positions: int, width: int, layers: int, heads: int, ids: str, lr: str
) -> str:
    """A plain cell building a GPT-2 (transformers, from a config: no download), AdamW and ``ids``.

    ``ids`` is the shape of the token ids drawn (a Python tuple's text), ``lr`` the learning rate.
    """
    return f"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging

logging.set_verbosity_error()
torch.manual_seed(0)
config = GPT2Config(
    vocab_size={vocab}, n_positions={positions}, n_embd={width}, n_layer={layers}, n_head={heads},
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
)
model = GPT2LMHeadModel(config)
optimizer = torch.optim.AdamW(model.parameters(), lr={lr})
ids = torch.randint(0, {vocab}, {ids})
"""


#: A small GPT-2, its AdamW and four micro-batches, on the CPU.
GPT_SETUP = gpt_setup(
    vocab=256, positions=32, width=64, layers=2, heads=4, ids="(4, 4, 32)", lr="1e-3"
)

#: A public GPT training step, as written for CUDA (4 micro-batches of gradient accumulation).
GPT_STEP = """device = "cuda"
model.to(device)
for micro in range(4):
    batch = ids[micro].to(device)
    loss = model(input_ids=batch, labels=batch).loss / 4
    loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
"""
