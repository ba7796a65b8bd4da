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

import torch

from neuron_workbench import emulate

emulate("neuron")  # before any backward pass in this process

from _workload import SETUP, best_of_interleaved, cell_for  # noqa: E402
from neuron_workbench.testing import run_cell, testing_shell  # noqa: E402

ROUNDS = 7


def main() -> None:
    torch.set_num_threads(1)
    shell = testing_shell()
    shell.display_pub.publish = lambda *a, **k: None  # measure the work, not the terminal printing
    run_cell(shell, SETUP)

    def plain(device: str) -> None:
        run_cell(shell, cell_for(device))

    def magic(target: str) -> None:
        run_cell(shell, f"%%neuron --ref cpu --target {target}\n" + cell_for("cuda"))

    baseline_cpu, magic_cpu = best_of_interleaved(
        lambda: (plain("cpu"), plain("cpu")), lambda: magic("cpu"), ROUNDS
    )
    baseline_mixed, magic_neuron = best_of_interleaved(
        lambda: (plain("cpu"), plain("neuron")), lambda: magic("neuron"), ROUNDS
    )
    print(
        f"magic overhead, cpu vs cpu:    {magic_cpu / baseline_cpu:.2f}x "
        f"(%%neuron {magic_cpu * 1e3:.1f} ms vs two plain runs {baseline_cpu * 1e3:.1f} ms; goal <= 1.3x)"
    )
    print(
        f"magic overhead, neuron vs cpu: {magic_neuron / baseline_mixed:.2f}x "
        f"(%%neuron {magic_neuron * 1e3:.1f} ms vs plain cpu + plain emulated neuron "
        f"{baseline_mixed * 1e3:.1f} ms)"
    )


if __name__ == "__main__":
    main()
