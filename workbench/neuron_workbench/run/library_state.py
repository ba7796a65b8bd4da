"""Process-wide state libraries keep about objects they built, rebuilt for objects sent by pickle.

A worker receives the notebook's objects unpickled: no constructor runs there, so what a library
records in a process-wide table while building an object is missing. ``transformers`` (5.x) keys
the outputs a model can record (``output_hidden_states``, ``output_attentions``,
``output_router_logits``) by model class in such a table, filled in ``PreTrainedModel.__init__``:
a model built in the notebook and called in the worker returned no hidden states or router logits,
and a Mixtral-style model's auxiliary loss became the integer 0.

Tables a notebook fills by calls of its own are sent with each run instead
(:func:`notebook_registrations`, taken by :func:`apply_registrations`): ``AutoConfig.register`` and
``AutoModel.register`` (``AutoTokenizer``'s, every Auto class's) in a plain cell, as Hugging Face's
guide to custom models has it, registered the notebook's classes in the kernel alone, so
``AutoModel.from_pretrained`` of the notebook's own checkpoint raised "Transformers does not
recognize this architecture" on the target.
"""

from __future__ import annotations

import contextlib
import importlib
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


#: Where transformers keeps its Auto classes' tables (``CONFIG_MAPPING``, ``MODEL_MAPPING``, ...).
_AUTO_MODULES = "transformers.models.auto."


def notebook_registrations() -> dict[tuple[str, str], dict[Any, Any]]:
    """What this process registered with transformers' Auto classes, for :func:`apply_registrations`.

    Returns
    -------
    dict
        ``(module, table name)`` to the entries registered in that table (a model type or a config
        class to the class it names); empty when transformers' Auto classes were not loaded or
        nothing was registered. Transformers' own entries are not in them: a table keeps what
        ``register`` added apart (``_extra_content``). An entry that cannot be pickled (a class
        holding a lock) is left out, rather than every cell failing to reach the worker.
    """
    registered: dict[tuple[str, str], dict[Any, Any]] = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(_AUTO_MODULES):
            continue
        for name, table in list(vars(module).items()):
            extra = getattr(table, "_extra_content", None)
            if not extra or not isinstance(extra, dict) or isinstance(table, type):
                continue
            entries = {key: value for key, value in list(extra.items()) if can_travel((key, value))}
            if entries:
                registered[(module_name, name)] = entries
    return registered


#: Whether each value :func:`can_travel` tried could be pickled: tried once per value.
_TRAVELS: dict[Any, bool] = {}


def can_travel(value: Any) -> bool:
    """Whether ``value`` (a class, a function, a tuple of them) can be pickled to another process.

    Tried once per value that can be a dict key (classes and functions are), each time otherwise.
    """
    try:
        known = _TRAVELS.get(value)
    except TypeError:
        known = None
    if known is None:
        import cloudpickle

        try:
            cloudpickle.dumps(value)
            known = True
        except Exception:  # noqa: BLE001 - whatever stops pickling stops the value travelling
            known = False
        with contextlib.suppress(TypeError):
            _TRAVELS[value] = known
    return known


def apply_registrations(registered: dict[tuple[str, str], dict[Any, Any]] | None) -> None:
    """Register in this process what :func:`notebook_registrations` read in the notebook's.

    Parameters
    ----------
    registered : dict or None
        As :func:`notebook_registrations` returns it; None or empty registers nothing.
    """
    for (module_name, name), entries in (registered or {}).items():
        table = getattr(importlib.import_module(module_name), name, None)
        extra = getattr(table, "_extra_content", None)
        if isinstance(extra, dict):
            extra.update(entries)
