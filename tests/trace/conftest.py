"""Fixtures of the trace tests."""

import pytest
from trace_model import CELL, make_namespace

from neuron_workbench.backends import get_backend
from neuron_workbench.run import RunSpec, compile_cell, execute
from neuron_workbench.trace.profile import op_profiler


@pytest.fixture(scope="session")
def profiled_runs():
    """The cell run on cpu and on emulated neuron with the op profiler (once per session)."""
    program = compile_cell(CELL)
    runs = {}
    for name in ("cpu", "neuron"):
        spec = RunSpec(program, make_namespace(), instruments={"profile": op_profiler})
        run = execute(spec, get_backend(name))
        assert run.ok, run.error
        runs[name] = run
    return program, runs
