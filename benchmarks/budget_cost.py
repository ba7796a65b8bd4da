"""The precision budget's cost: the float64 oracle run against the reference run it repeats.

Figures, each a ratio of times measured in this run:
- GPT training step (``transformers``' GPT-2 from a small config, 4 micro-batches and an AdamW step,
  written for CUDA): the oracle rerun (float64, the promoting function mode on the reference path)
  against the reference run (cpu standing in for cuda). Goal: at most 3x.
- A float32 MLP forward and backward (64x256x10), the same ratio.

Both runs go through :func:`neuron_workbench.run.executor.execute` as the report does. Timings are
host CPU time; each figure is the best of alternating rounds after a warm-up round.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import GPT_SETUP, GPT_STEP  # noqa: E402

ROUNDS = 5
GOAL = 3.0


MLP_SETUP = """
import torch
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
x = torch.randn(512, 64)
"""

MLP_STEP = """m = mlp.cuda()
loss = m(x.cuda()).pow(2).mean()
loss.backward()
"""


def ratio(setup: str, cell: str) -> tuple[float, float, float]:
    """Best oracle time / best reference time for ``cell`` after ``setup``."""
    from neuron_workbench.backends import get_backend
    from neuron_workbench.compare.budget import _rerun, oracle_instrument
    from neuron_workbench.run import RunSpec, compile_cell, execute

    namespace: dict = {}
    exec(setup, namespace)
    spec = RunSpec(compile_cell(cell), namespace)
    cpu = get_backend("cpu")
    best = {"ref": float("inf"), "oracle": float("inf")}
    for round_ in range(ROUNDS + 1):
        for which in ("ref", "oracle"):
            start = time.perf_counter()
            run = (
                execute(spec, cpu, run_id="ref")
                if which == "ref"
                else _rerun(spec, cpu, oracle_instrument(spec))
            )
            elapsed = time.perf_counter() - start
            assert run.ok, run.error
            if round_:
                best[which] = min(best[which], elapsed)
    return best["oracle"] / best["ref"], best["oracle"], best["ref"]


def main() -> int:
    status = 0
    for name, setup, cell in (
        ("GPT training step (4 micro-batches)", GPT_SETUP, GPT_STEP),
        ("MLP forward+backward", MLP_SETUP, MLP_STEP),
    ):
        factor, oracle, ref = ratio(setup, cell)
        print(
            f"{name}: float64 oracle {factor:.2f}x the reference run "
            f"({oracle * 1e3:.1f} ms vs {ref * 1e3:.1f} ms, host CPU time; goal <= {GOAL:.1f}x)"
        )
        status = status or int(factor > GOAL)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
