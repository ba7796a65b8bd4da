"""A mid-size model on the default path: what shipping its state costs a %%neuron cell.

A 35M-parameter GPT-2 (``transformers``, built from a config) takes one AdamW step per cell, written
for CUDA. Its state (weights and optimizer moments, about 400 MiB) travels to the target's worker
and back every cell, through shared-memory arenas. Each figure comes from a fresh kernel process
(and its worker) started in this run with the figure's environment:

- the cell with the arenas kept between cells, as by default (a loaded arena up to a share of the
  host's memory stays for the next message to be written into), against the same cell with only
  arenas up to 8 MiB kept (``NEURON_WORKBENCH_KEPT_ARENA_MIB=8``, the limit before): lower is better;
- each against the cell run twice as plain CPU code in the same process, for information.

Timings are wall-clock times of whole cells on the host (the target is the emulated device); each
is the minimum over rounds after two warm-up cells, rounds alternating with the plain cell.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import gpt_setup, quiet_shell, result_in_fresh_process  # noqa: E402

ROUNDS = 4
RESULT_MARK = "TRANSFER_RESULT "

#: A 35M-parameter GPT-2 and its AdamW: about 140 MiB of weights and 270 MiB of moments.
SETUP = gpt_setup(vocab=8192, positions=64, width=768, layers=4, heads=12, ids="(2, 32)", lr="1e-4")

STEP = """device = "cuda"
model.to(device)
loss = model(input_ids=ids.to(device), labels=ids.to(device)).loss
loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
"""


def measure() -> dict[str, float]:
    """Best times of the %%neuron cell and of the plain cell run twice, in this process."""
    from neuron_workbench.testing import run_cell

    shell = quiet_shell(SETUP)
    magic_cell = "%%neuron -o transfer_report\n" + STEP
    plain_cell = STEP.replace('device = "cuda"', 'device = "cpu"')
    for _ in range(2):  # the worker starts, the optimizer's moments appear
        run_cell(shell, magic_cell)
    magic, plain = float("inf"), float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        run_cell(shell, magic_cell)
        magic = min(magic, time.perf_counter() - start)
        report = shell.user_ns.pop("transfer_report")
        assert report.verdict == "PASS", report.summary()
        del report  # its target run maps the answer's arena: gone before the next cell, as unbound
        start = time.perf_counter()
        run_cell(shell, plain_cell)
        run_cell(shell, plain_cell)
        plain = min(plain, time.perf_counter() - start)
    return {"magic_s": magic, "plain_s": plain}


def _in_fresh_process(kept_mib: str | None) -> dict[str, float]:
    from neuron_workbench.run.transport import KEPT_ARENA_ENV

    env = dict(os.environ)
    env.pop(KEPT_ARENA_ENV, None)
    if kept_mib is not None:
        env[KEPT_ARENA_ENV] = kept_mib
    return result_in_fresh_process(__file__, ["--measure"], RESULT_MARK, env)


def main() -> int:
    before = _in_fresh_process("8")
    kept = _in_fresh_process(None)
    ratio = kept["magic_s"] / before["magic_s"]
    print(
        f"35M-parameter GPT-2 AdamW step through %%neuron, default executor: arenas kept "
        f"{ratio:.2f}x the time with only 8 MiB kept ({kept['magic_s'] * 1e3:.0f} ms vs "
        f"{before['magic_s'] * 1e3:.0f} ms; lower is better)"
    )
    for label, figure in (("kept", kept), ("8 MiB kept", before)):
        print(
            f"  {label}: {figure['magic_s'] / figure['plain_s']:.2f}x the cell run twice as plain "
            f"CPU code ({figure['magic_s'] * 1e3:.0f} ms vs {figure['plain_s'] * 1e3:.0f} ms)"
        )
    return 0


if __name__ == "__main__":
    if "--measure" in sys.argv:
        print(RESULT_MARK + json.dumps(measure()))
    else:
        raise SystemExit(main())
