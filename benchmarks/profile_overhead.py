"""%%neuron --profile against plain %%neuron on the same training-step cell, in the same run.

Two figures, each the minimum over interleaved rounds after a warm-up round:
- cpu/cpu: ``%%neuron --ref cpu --target cpu --profile`` against the same magic without
  ``--profile``; everything the op profiler adds (dispatch-mode recorder on every op of both runs,
  building the profiles, embedding them in the report data) and nothing else.
- cpu/neuron: the same on the emulated neuron target, where the emulator's own per-op cost is in
  both sides.
The recorder only exists while ``--profile`` is given; the plain magic runs none of its code.

A third line measures what a Jupyter kernel adds to every cell: building the ``ReportView`` and its
display bundle (static charts included) for a report with fallbacks, against the plain magic.
(The testing shell used here has no frontend, so ``show_report`` itself displays nothing.)
"""

from __future__ import annotations

import torch

from neuron_workbench import emulate

emulate("neuron")  # before any backward pass in this process

from _workload import SETUP, best_of_interleaved, cell_for  # noqa: E402
from neuron_workbench.testing import run_cell, testing_shell  # noqa: E402

ROUNDS = 15
CELL = cell_for("cuda")


def main() -> None:
    torch.set_num_threads(1)
    shell = testing_shell()
    shell.display_pub.publish = lambda *a, **k: None  # measure the work, not the terminal printing
    run_cell(shell, SETUP)

    def magic(target: str, flags: str = "") -> None:
        run_cell(shell, f"%%neuron --ref cpu --target {target} --no-scan {flags}\n" + CELL)

    ops = {}

    def count_ops() -> None:
        run_cell(shell, f"%%neuron --ref cpu --target cpu --no-scan --profile -o _r\n{CELL}")
        profile = shell.user_ns["_r"].ref.extras["profile"].result()
        ops["calls"] = sum(row.calls for row in profile.rows)

    count_ops()
    for target in ("cpu", "neuron"):
        plain, profiled = best_of_interleaved(
            lambda t=target: magic(t), lambda t=target: magic(t, "--profile"), ROUNDS
        )
        extra_us = (profiled - plain) / (2 * ops["calls"]) * 1e6
        print(
            f"--profile overhead, cpu vs {target}: {profiled / plain:.2f}x "
            f"(%%neuron --profile {profiled * 1e3:.1f} ms vs %%neuron {plain * 1e3:.1f} ms; "
            f"{ops['calls']} ops per run, about {extra_us:.0f} us more per op)"
        )

    from neuron_workbench.views.widget import ReportView

    run_cell(shell, f"%%neuron --ref cpu --target neuron --no-scan -o _plain\n{CELL}")
    report = shell.user_ns["_plain"]
    ReportView(report)._repr_mimebundle_()  # plotly's one-time start-up, paid by the first cell
    plain, viewed = best_of_interleaved(
        lambda: magic("neuron"),
        lambda: (magic("neuron"), ReportView(report)._repr_mimebundle_()),
        ROUNDS,
    )
    print(
        f"report view per cell (kernel only), cpu vs neuron: {viewed / plain:.2f}x "
        f"(%%neuron + ReportView {viewed * 1e3:.1f} ms vs %%neuron {plain * 1e3:.1f} ms)"
    )


if __name__ == "__main__":
    main()
