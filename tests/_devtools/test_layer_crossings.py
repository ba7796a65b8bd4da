"""A ``%%neuron`` cell's calls cross between ``run/`` and ``report/`` only where data is read.

The orchestration lives in ``cell/``: it runs the cell (``run/``), then builds the report
(``report/``) from the runs' plain data. So no call goes from ``run/`` into ``report/``, and the
report only reads run records (``Run.ok``, ``to_dict``), never executes anything in ``run/``.
"""

import collections
import sys

from neuron_workbench import testing

CELL = "%%neuron --ref cpu --steps 2 --profile -o r\nw = torch.ones(3, device='cuda')\nw = w * 2\n"
#: The run modules that hold data the report reads: records, tagged numbers, observed scalars.
RUN_DATA = {"neuron_workbench.run.records", "neuron_workbench.run.measurements",
            "neuron_workbench.run.scalars"}  # fmt: skip


def _unit(frame):
    name = frame.f_globals.get("__name__", "")
    return name.split(".")[1] if name.startswith("neuron_workbench.") else None


def test_run_never_calls_report_and_report_only_reads_run_data():
    shell = testing.testing_shell()
    testing.run_cell(shell, "import torch")
    testing.run_cell(shell, CELL)  # starts the worker, imports everything
    crossings = collections.defaultdict(set)

    def profile(frame, event, arg):
        callee = _unit(frame) if event == "call" else None
        if callee not in ("report", "run"):
            return
        caller = frame.f_back
        while caller is not None and _unit(caller) is None:
            caller = caller.f_back
        if caller is not None and _unit(caller) in ("report", "run") and _unit(caller) != callee:
            crossings[_unit(caller), callee].add(frame.f_globals["__name__"])

    sys.setprofile(profile)
    try:
        testing.run_cell(shell, CELL)
    finally:
        sys.setprofile(None)
    assert shell.user_ns["r"].verdict == "PASS"
    assert not crossings[("run", "report")]
    # the probe sees crossings: the report reads the runs' records
    assert crossings[("report", "run")] and crossings[("report", "run")] <= RUN_DATA
