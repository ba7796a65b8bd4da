"""%%neuron on the default path (no option: the target in its worker) against plain CPU code.

Figures, each a ratio or difference of figures measured in this run:
- GPT training step: ``transformers``' GPT-2 built from a small config, one optimizer step over 4
  micro-batches, written for CUDA and left as it is. ``%%neuron`` with no option (warm worker) against
  the same cell run twice as plain CPU code in the same kernel. Goal: at most 1.0x (the reference and
  the target run at the same time on a machine with two or more cores).
- A notebook-defined model: the small CNN training step of ``_workload`` (its class is defined in
  the notebook, so it travels by value with every request and answer), the same comparison, for
  information (no goal: its convolutions are compute-bound, and each run gets half the cores).
- Where the GPT cell's time goes, for information: the two runs' bodies inside ``%%neuron`` (they
  run at the same time), the time outside the longer body (shipping the cell's state, the answer,
  comparison, report and display), and what the remap's Python function mode alone adds to one
  body (the step run plain and under the remap, in this process on the host, rounds alternating).
- Per-op overhead of the worker path: tiny ops (add, add_, sum, 4x4 matmul) in the cell's target run,
  in the worker against ``--executor inprocess`` (a separate process holding the emulated device), as
  each report's target wall time divided by the op count. Goal: within 1 us.

Timings are host CPU time (the target is the emulated device). Each figure is the minimum over
rounds after a warm-up round, rounds alternating so machine noise hits both alike. The GPT figure is
measured in several fresh processes (kernel and worker each) and the median process decides: on the
2-vCPU machine the plain step runs at one of two speeds for a whole process (about 14-17 or 20-22 ms,
with or without the workbench loaded), so one process's ratio was 0.97x or 1.33x by that luck alone.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _workload import GPT_SETUP as SETUP  # noqa: E402
from _workload import (  # noqa: E402
    GPT_STEP,
    best_of_interleaved,
    cell_for,
    quiet_shell,
    result_in_fresh_process,
)
from _workload import SETUP as CNN_SETUP  # noqa: E402

ROUNDS = 11  # minimum over this many alternating rounds: one noisy round moves no figure
PROCESSES = 5  # fresh processes measuring the GPT figure; the median one decides
GPT_GOAL = 1.0
PER_OP_GOAL_US = 1.0
OPS = 4000  # loop iterations of the per-op cell (four ops each)

PER_OP_CELL = f"""x = torch.randn(8, device="cuda")
y = torch.randn(8, device="cuda")
a = torch.randn(4, 4, device="cuda")
for _ in range({OPS}):
    x + y
    x.add_(y)
    x.sum()
    a @ a
done = x.sum()
"""

RESULT_MARK = "DEFAULT_PATH_RESULT "


def per_op_target_us(shell, flags: str) -> float:
    """Best target wall time per op of the per-op cell run with ``flags``."""
    from neuron_workbench.testing import run_cell

    best = float("inf")
    for _ in range(ROUNDS + 1):
        run_cell(shell, f"%%neuron {flags} -o per_op_report\n{PER_OP_CELL}")
        report = shell.user_ns["per_op_report"]
        assert report.verdict == "PASS", report.summary()
        best = min(best, report.target.wall_time_s / (4 * OPS))
    return best * 1e6


@dataclass
class Figure:
    """Best times of a ``%%neuron`` cell and of its plain cell run twice, with the runs' bodies."""

    magic_s: float
    plain_s: float
    #: best wall times of the reference and target runs inside ``%%neuron`` (host CPU time both)
    ref_s: float
    target_s: float
    #: the first ``%%neuron`` cell, right after the setup cell (its worker was launched as the
    #: extension loaded, before the setup cell)
    first_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.magic_s / self.plain_s


def magic_against_plain_twice(shell, cuda_cell: str, cpu_cell: str) -> Figure:
    """Best ``%%neuron`` time of ``cuda_cell`` against twice ``cpu_cell``, rounds alternating."""
    from neuron_workbench.testing import run_cell

    magic_cell = "%%neuron -o figure_report\n" + cuda_cell
    first = time.perf_counter()
    run_cell(shell, magic_cell)  # waits for what is left of the worker's start
    first_s = time.perf_counter() - first
    report = shell.user_ns["figure_report"]
    assert report.verdict == "PASS", report.summary()
    bodies = {"ref": float("inf"), "target": float("inf")}

    def magic() -> None:
        run_cell(shell, magic_cell)
        report = shell.user_ns["figure_report"]
        bodies["ref"] = min(bodies["ref"], report.ref.wall_time_s)
        bodies["target"] = min(bodies["target"], report.target.wall_time_s)

    plain_best, magic_best = best_of_interleaved(
        lambda: (run_cell(shell, cpu_cell), run_cell(shell, cpu_cell)), magic, ROUNDS
    )
    return Figure(magic_best, plain_best, bodies["ref"], bodies["target"], first_s)


def remap_mode_cost_s(shell, cuda_cell: str, cpu_cell: str) -> tuple[float, float]:
    """Best body time of ``cpu_cell`` plain and of ``cuda_cell`` under the host's remap (no report).

    Both run in the kernel's namespace, on the host (this process holds no device): the difference
    is what the remap's function mode, the part a run cannot do without today, costs a body.
    """
    from neuron_workbench.backends import get_backend
    from neuron_workbench.run.cuda_on_host import CudaOnHost
    from neuron_workbench.run.remap import cuda_remapped_to

    namespace = shell.user_ns
    plain, remapped = compile(cpu_cell, "plain", "exec"), compile(cuda_cell, "remapped", "exec")
    cpu = get_backend("cpu")
    host = CudaOnHost([])  # one for every round: after the warm-up the model is on its "cuda"

    def under_remap() -> None:
        with cuda_remapped_to(cpu, host=host):
            exec(remapped, namespace)

    under_remap()  # warm-up: the first move to the host's cuda copies the model
    return best_of_interleaved(lambda: exec(plain, namespace), under_remap, ROUNDS)


def inprocess_main() -> None:
    """The in-process baseline of the per-op figure (this process holds the emulated device)."""
    from neuron_workbench import emulate

    emulate("neuron")
    shell = quiet_shell(SETUP)
    print(RESULT_MARK + json.dumps({"per_op_us": per_op_target_us(shell, "--executor inprocess")}))


def gpt_main() -> None:
    """One process's GPT figure and the remap mode's cost, as a result line for :func:`main`."""
    from neuron_workbench.backends.registry import resolve_executor

    assert resolve_executor("auto", ["neuron"]) == "worker", "the kernel must hold no device"
    shell = quiet_shell(SETUP)
    plain_step = GPT_STEP.replace('device = "cuda"', 'device = "cpu"')
    gpt = magic_against_plain_twice(shell, GPT_STEP, plain_step)
    plain_body, remapped_body = remap_mode_cost_s(shell, GPT_STEP, plain_step)
    figures = {**asdict(gpt), "plain_body_s": plain_body, "remapped_body_s": remapped_body}
    print(RESULT_MARK + json.dumps(figures))


def _in_fresh_process(flag: str) -> dict[str, float]:
    return result_in_fresh_process(__file__, [flag], RESULT_MARK)


def main() -> int:
    from neuron_workbench.backends.registry import resolve_executor
    from neuron_workbench.testing import run_cell

    assert resolve_executor("auto", ["neuron"]) == "worker", "the kernel must hold no device"
    runs = sorted(
        (_in_fresh_process("--gpt") for _ in range(PROCESSES)),
        key=lambda f: f["magic_s"] / f["plain_s"],
    )
    median = runs[len(runs) // 2]
    gpt = Figure(
        median["magic_s"], median["plain_s"], median["ref_s"], median["target_s"], median["first_s"]
    )
    print(
        f"GPT training step (4 micro-batches) through %%neuron, default executor, warm: "
        f"{gpt.ratio:.2f}x the cell run twice as plain CPU code "
        f"({gpt.magic_s * 1e3:.1f} ms vs {gpt.plain_s * 1e3:.1f} ms; goal <= {GPT_GOAL:.1f}x), "
        f"the median of {PROCESSES} processes"
    )
    print(
        "  each process: "
        + ", ".join(
            f"{f['magic_s'] / f['plain_s']:.2f}x ({f['magic_s'] * 1e3:.1f} vs "
            f"{f['plain_s'] * 1e3:.1f} ms)"
            for f in runs
        )
    )
    # Where a cell's time goes: the two runs' bodies, side by side (host CPU time both).
    print(
        f"  the cell's runs inside %%neuron: reference {gpt.ref_s * 1e3:.1f} ms, target "
        f"{gpt.target_s * 1e3:.1f} ms (emulated neuron: host CPU time), at the same time; "
        f"plain cell once {gpt.plain_s / 2 * 1e3:.1f} ms"
    )
    plain_body, remapped_body = median["plain_body_s"], median["remapped_body_s"]
    outside = gpt.magic_s - max(gpt.ref_s, gpt.target_s)
    print(
        f"  outside the longer body: {outside * 1e3:.1f} ms (shipping state and answer, "
        f"comparison, report, display); the remap's function mode adds "
        f"{(remapped_body - plain_body) * 1e3:.1f} ms to one body "
        f"({remapped_body * 1e3:.1f} ms vs {plain_body * 1e3:.1f} ms plain, host, one at a time)"
    )
    first = min(f["first_s"] for f in runs), max(f["first_s"] for f in runs)
    print(
        f"  the first %%neuron cell, right after the setup cell: {first[0]:.2f}-{first[1]:.2f} s "
        f"over the processes, against {gpt.magic_s * 1e3:.1f} ms warm (each process's first "
        f"model step, imports and transfers; its worker was launched as the extension loaded; "
        f"for information)"
    )
    shell = quiet_shell(SETUP)
    run_cell(shell, CNN_SETUP)
    cnn = magic_against_plain_twice(shell, cell_for("cuda"), cell_for("cpu"))
    print(
        f"notebook-defined CNN training step through %%neuron, default executor, warm: "
        f"{cnn.ratio:.2f}x the cell run twice as plain CPU code "
        f"({cnn.magic_s * 1e3:.1f} ms vs {cnn.plain_s * 1e3:.1f} ms; for information)"
    )
    worker_us = per_op_target_us(shell, "")
    inprocess_us = _in_fresh_process("--inprocess")["per_op_us"]
    overhead = worker_us - inprocess_us
    print(
        f"per-op overhead of the worker path: {overhead:+.2f} us "
        f"(worker {worker_us:.2f} us vs in-process {inprocess_us:.2f} us per op; "
        f"goal <= {PER_OP_GOAL_US:.1f} us)"
    )
    return 0 if gpt.ratio <= GPT_GOAL and overhead <= PER_OP_GOAL_US else 1


if __name__ == "__main__":
    if "--inprocess" in sys.argv:
        inprocess_main()
    elif "--gpt" in sys.argv:
        gpt_main()
    else:
        raise SystemExit(main())
