"""The random state runs start from and leave to the notebook."""

import random

import numpy as np
import torch

from neuron_workbench.run.random_state import current_random_state, restore_random_state
from neuron_workbench.run.transport import dumps, loads


def _draws():
    return torch.rand(2).tolist(), random.random(), float(np.random.rand())


def test_a_restored_state_draws_the_same_numbers_here_and_after_travelling():
    state = current_random_state()
    first = _draws()
    restore_random_state(state)
    assert _draws() == first
    restore_random_state(loads(dumps(state)))  # as a worker receives it
    assert _draws() == first
