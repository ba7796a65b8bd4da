"""The random state a run starts from, and the one it leaves to the notebook.

Without ``--seed``, both runs of a cell start from the notebook's random state as it is before the
cell (torch's CPU generator, which the host standing in for cuda and the emulated devices draw
from, Python's ``random`` and NumPy's global generator), and the kept run's state is the
notebook's afterwards: an epoch cell run again shuffles anew and a ``torch.manual_seed`` in a plain
cell holds, as in plain code. A real accelerator's own generator is left as it is.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Any

import torch

try:
    # NumPy imports its generators' module on first use: first used by a run (seeding it), it was
    # imported while a script's folder came first on sys.path, and a script's own secrets.py was
    # taken for the one NumPy's generators import
    import numpy.random  # noqa: F401
except ImportError:  # torch runs without NumPy: nothing of it to seed or restore
    pass

#: The generator behind the ``random`` module's functions (``from random import shuffle``): the one
#: whose state a run starts from and leaves, never copied.
RANDOM_MODULE_GENERATOR = random._inst  # type: ignore[attr-defined]


@dataclass
class RandomState:
    """The generators' states: torch's CPU one, Python's ``random``, NumPy's global one."""

    torch_cpu: torch.Tensor
    python: Any
    #: None when NumPy was not imported (nothing of it to restore)
    numpy: Any = None


def current_random_state() -> RandomState:
    """The random state of this process now."""
    numpy = sys.modules.get("numpy")
    return RandomState(
        torch.get_rng_state(),
        random.getstate(),
        numpy.random.get_state() if numpy is not None else None,
    )


def restore_random_state(state: RandomState) -> None:
    """Make ``state`` this process's random state."""
    torch.set_rng_state(state.torch_cpu)
    random.setstate(state.python)
    if state.numpy is not None:
        import numpy

        numpy.random.set_state(state.numpy)
