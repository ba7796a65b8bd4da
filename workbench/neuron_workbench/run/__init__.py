"""Execute a cell on one backend: compile, isolate, remap CUDA, record, restore."""

from neuron_workbench.run.cell import CellProgram, compile_cell
from neuron_workbench.run.executor import LAST_EXPRESSION, RunSpec, commit, execute, mark_resident
from neuron_workbench.run.namespace import ResidentObjects
from neuron_workbench.run.records import Run, RunError

__all__ = [
    "LAST_EXPRESSION",
    "CellProgram",
    "ResidentObjects",
    "Run",
    "RunError",
    "RunSpec",
    "commit",
    "compile_cell",
    "execute",
    "mark_resident",
]
