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
recognize this architecture" on the target; ``AttentionInterface.register("my_attention", fn)``
left a model built with ``attn_implementation="my_attention"`` without its attention there.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from neuron_workbench.run.patching import loaded_modules_under


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


def notebook_registrations() -> dict[tuple[str, str, str], dict[Any, Any]]:
    """What this process registered with transformers, for :func:`apply_registrations`.

    The Auto classes' tables (``AutoModel.register``), and the interfaces a model looks its kernels
    up in (``AttentionInterface.register("my_attention", fn)`` for
    ``attn_implementation="my_attention"``).

    Returns
    -------
    dict
        ``(module, table name, attribute)`` to the entries registered in that table (a model type
        or a config class to the class it names, a name to a function); empty when transformers
        was not loaded or nothing was registered. Transformers' own entries are not in them: an
        Auto table keeps what ``register`` added apart (``_extra_content``), and an interface's
        own functions are transformers'. An entry that cannot be pickled (a class holding a lock)
        is left out, rather than every cell failing to reach the worker.
    """
    tables: list[tuple[tuple[str, str, str], dict[Any, Any]]] = []
    for module in loaded_modules_under(_AUTO_MODULES):
        for name, table in list(vars(module).items()):
            extra = getattr(table, "_extra_content", None)
            if extra and isinstance(extra, dict) and not isinstance(table, type):
                tables.append(((module.__name__, name, "_extra_content"), extra))
    generic = sys.modules.get("transformers.utils.generic")
    interfaces = [getattr(generic, "GeneralInterface", None)]
    while interfaces:
        interface = interfaces.pop()
        if not isinstance(interface, type):
            continue
        interfaces.extend(interface.__subclasses__())
        mapping = vars(interface).get("_global_mapping")
        if isinstance(mapping, dict):
            own = {
                key: value
                for key, value in mapping.items()
                if not str(getattr(value, "__module__", "")).startswith("transformers.")
            }
            where = (interface.__module__, interface.__qualname__, "_global_mapping")
            tables.append((where, own))
    registered = {}
    for where, table in tables:
        entries = {
            key: value
            for key, value in list(table.items())
            if not _remote_code(key)
            and not _remote_code(value)
            and (isinstance(key, str) or can_travel(key))
            and can_travel(value)
        }
        if entries:
            registered[where] = entries
    return registered


def _remote_code(value: Any) -> bool:
    """Whether ``value`` is a class of a checkpoint's own code (``trust_remote_code=True``).

    ``from_pretrained`` registers those itself, from modules (``transformers_modules.<hash>``) that
    only a process that loaded the checkpoint can import: sent with every request, one would stop
    every later cell from loading in the worker.
    """
    return str(getattr(value, "__module__", "")).startswith("transformers_modules")


#: Whether each class or function :func:`can_travel` tried could be pickled, while it lives: tried
#: once each, without keeping a hook the notebook removed (and what it holds) alive.
_TRAVELS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def can_travel(value: Any) -> bool:
    """Whether ``value`` (a class, a function) can be pickled to another process.

    Tried once per value that can be weakly referenced (classes and functions can), each time
    otherwise.
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


def apply_registrations(registered: dict[tuple[str, str, str], dict[Any, Any]] | None) -> None:
    """Register in this process what :func:`notebook_registrations` read in the notebook's.

    Parameters
    ----------
    registered : dict or None
        As :func:`notebook_registrations` returns it; None or empty registers nothing.
    """
    for (module_name, name, attribute), entries in (registered or {}).items():
        owner = getattr(importlib.import_module(module_name), name, None)
        table = getattr(owner, attribute, None)
        if isinstance(table, dict):
            table.update(entries)


#: torch.nn's tables of hooks every module calls, with the function that registers one there.
_MODULE_HOOKS = (
    ("_global_forward_pre_hooks", "register_module_forward_pre_hook"),
    ("_global_forward_hooks", "register_module_forward_hook"),
    ("_global_backward_pre_hooks", "register_module_full_backward_pre_hook"),
    ("_global_backward_hooks", "register_module_full_backward_hook"),
)
#: The handles :func:`apply_module_hooks` registered here, removed before it registers again.
_applied_hooks: list[Any] = []


def notebook_module_hooks() -> list[tuple[str, Any, dict[str, bool]]]:
    """The hooks for every module this process's notebook registered, for :func:`apply_module_hooks`.

    ``torch.nn.modules.module.register_module_forward_hook(record)`` in a plain cell (activation
    statistics of every layer, a NaN check) is process-wide: a target in another process ran the
    cell's modules without it, so what the hook recorded (a scalar it took with ``.item()``) was the
    reference's alone and the cell FAILed.

    Returns
    -------
    list of (str, callable, dict)
        The registering function's name, the hook, and its keyword options (``with_kwargs``,
        ``always_call``), in the order they were registered. The workbench's own hooks (``--layers``
        records through them) and a hook that cannot be pickled are left out.
    """
    from torch.nn.modules import module

    hooks = []
    for table_name, register in _MODULE_HOOKS:
        table = getattr(module, table_name, None)
        if not isinstance(table, dict) or not table:
            continue
        if table_name == "_global_backward_hooks" and not module._global_is_full_backward_hook:
            register = "register_module_backward_hook"
        for key, hook in list(table.items()):
            if _workbench_own(hook) or not can_travel(hook):
                continue
            options = {}
            if table_name == "_global_forward_hooks":
                options = {
                    "with_kwargs": key in module._global_forward_hooks_with_kwargs,
                    "always_call": key in module._global_forward_hooks_always_called,
                }
            hooks.append((register, hook, options))
    return hooks


def _workbench_own(hook: Any) -> bool:
    return str(getattr(hook, "__module__", None) or "").startswith("neuron_workbench.")


def apply_module_hooks(hooks: list[tuple[str, Any, dict[str, bool]]] | None) -> None:
    """Register in this process the hooks :func:`notebook_module_hooks` read in the notebook's.

    The ones the previous call registered are removed first: each run has the notebook's hooks as
    they are when it starts.

    Parameters
    ----------
    hooks : list or None
        As :func:`notebook_module_hooks` returns it; None or empty registers none.
    """
    from torch.nn.modules import module

    while _applied_hooks:
        _applied_hooks.pop().remove()
    for register, hook, options in hooks or []:
        _applied_hooks.append(getattr(module, register)(hook, **options))
