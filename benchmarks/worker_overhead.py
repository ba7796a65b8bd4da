"""%%neuron with the target in a worker process vs in the kernel, on the training-step cell.

Figures:
- warm worker: ``%%neuron --ref cpu --target neuron --executor worker`` against the same cell with
  ``--executor inprocess`` (both emulate neuron; the worker adds shipping what the cell reads, the
  round trip, and sending results back). Goal: at most 1.3x.
- cold start: the first worker cell of a session (spawning the process, importing torch, installing
  the emulated device) against a warm worker cell, reported separately.
Each warm figure is the minimum over rounds, after a warm-up round. Timings are host CPU time.
"""

from __future__ import annotations

import time

import torch

from neuron_workbench import emulate

emulate("neuron")  # the in-process baseline needs the device before any backward pass

from _workload import SETUP, best_of_interleaved, cell_for  # noqa: E402
from neuron_workbench.testing import run_cell, testing_shell  # noqa: E402

ROUNDS = 7


def main() -> None:
    torch.set_num_threads(1)
    shell = testing_shell()
    shell.display_pub.publish = lambda *a, **k: None  # measure the work, not the terminal printing
    run_cell(shell, SETUP)

    def magic(executor: str) -> None:
        run_cell(
            shell,
            f"%%neuron --ref cpu --target neuron --executor {executor}\n" + cell_for("cuda"),
        )

    start = time.perf_counter()
    magic("worker")
    cold = time.perf_counter() - start
    inprocess, worker = best_of_interleaved(
        lambda: magic("inprocess"), lambda: magic("worker"), ROUNDS
    )
    print(
        f"worker executor overhead, warm: {worker / inprocess:.2f}x "
        f"(worker {worker * 1e3:.1f} ms vs in-process {inprocess * 1e3:.1f} ms; goal <= 1.3x)"
    )
    print(
        f"worker executor cold start: {cold:.2f} s for the first cell "
        f"({cold / worker:.1f}x a warm worker cell)"
    )


if __name__ == "__main__":
    main()
