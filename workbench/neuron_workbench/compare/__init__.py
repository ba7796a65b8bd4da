"""Numerical comparison of two runs' outputs (pure torch, no IPython)."""

from neuron_workbench.compare.compare import (
    NOT_COMPARED,
    STATUSES,
    Comparison,
    Measurement,
    OutputDiff,
    compare_leaf,
    compare_outputs,
)
from neuron_workbench.compare.tolerances import DTYPE_TOLERANCES, Tolerance, default_tolerance

__all__ = [
    "DTYPE_TOLERANCES",
    "NOT_COMPARED",
    "STATUSES",
    "Comparison",
    "Measurement",
    "OutputDiff",
    "Tolerance",
    "compare_leaf",
    "compare_outputs",
    "default_tolerance",
]
