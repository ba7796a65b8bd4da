"""Process-wide state libraries keep about objects they built, rebuilt for objects sent by pickle.

A worker receives the notebook's objects unpickled: no constructor runs there, so what a library
records in a process-wide table while building an object is missing. ``transformers`` (5.x) keys
the outputs a model can record (``output_hidden_states``, ``output_attentions``,
``output_router_logits``) by model class in such a table, filled in ``PreTrainedModel.__init__``:
a model built in the notebook and called in the worker returned no hidden states or router logits,
and a Mixtral-style model's auxiliary loss became the integer 0.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import torch


def restore_library_state(values: Iterable[Any]) -> None:
    """Record in this process what libraries would have recorded when ``values`` were built."""
    capturing = sys.modules.get("transformers.utils.output_capturing")
    registry = getattr(capturing, "_CAN_RECORD_REGISTRY", None)
    if registry is None:  # transformers (5.x) is not loaded here: nothing of it was received
        return
    for value in values:
        if not isinstance(value, torch.nn.Module):
            continue
        for module in value.modules():
            can_record = getattr(type(module), "_can_record_outputs", None)
            if can_record is not None and str(type(module)) not in registry:
                registry[module] = can_record
