"""Turn a cell's outputs into leaves with readable paths (``out['logits'][0]``, ``model.fc.weight``).

What is walked, in order of precedence:

- tensors, NumPy arrays and scalars, Python numbers, strings, bytes and ``None`` are leaves;
- a :class:`~neuron_workbench.run.records.NotCompared` marker (an output that could not come back
  from the target's process) is a leaf, so the comparison can say so;
- ``nn.Module`` parameters, their ``.grad`` and buffers, and the tensors a module (or one of its
  submodules) holds as plain attributes (a KV cache kept as ``self.kv``); optimizer state;
- dataclasses, mappings, lists, tuples and deques, by field, key and index; ``SimpleNamespace`` and
  ``argparse.Namespace`` objects by attribute;
- instances of classes defined in the notebook (a class whose ``__module__`` is one of
  ``user_modules``, ``__main__`` by default), by their instance attributes: ``trainer.model.fc.weight``.
  Every attribute in the instance's ``__dict__`` (and ``__slots__``) is walked, ``_``-names
  included: dataclass fields and module parameters are walked whatever their names, and a model
  kept as ``self._model`` is as much the cell's result as ``self.model``; properties are not
  evaluated. Each object is walked once per output (at its first path), which also ends cycles.

Anything else (functions, classes, modules, methods, devices, DataLoaders, library objects) is not a
numeric output and yields nothing, as does a notebook object with nothing comparable in it.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch

from neuron_workbench.run.namespace import PLAIN_NAMESPACES, module_attributes, tensors_held
from neuron_workbench.run.records import NotCompared

__all__ = ["USER_MODULES", "iter_leaves"]

_MAX_DEPTH = 16
#: ``__module__`` of the classes a notebook (or a script run as a cell) defines.
USER_MODULES: tuple[str, ...] = ("__main__",)


def iter_leaves(
    outputs: Mapping[str, Any], *, user_modules: Collection[str] = USER_MODULES
) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, leaf)`` for every comparable value under each named output, in order.

    Parameters
    ----------
    outputs : mapping of str to object
        Output name to value, as a run bound them.
    user_modules : collection of str, optional
        Module names whose classes' instances are walked through their attributes (the
        namespace's ``__name__``; :data:`USER_MODULES` by default).

    Yields
    ------
    tuple of (str, object)
        The leaf's path (``trainer.model.fc.weight``, ``out['logits'][0]``) and the leaf: a tensor,
        an array, a Python scalar, a string, ``None`` or a :class:`NotCompared` marker.
    """
    modules = frozenset(user_modules)
    for name, value in outputs.items():
        yield from _walk(name, value, 0, set(), modules)


def _walk(
    path: str, value: Any, depth: int, seen: set[int], modules: frozenset[str]
) -> Iterator[tuple[str, Any]]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, torch.Tensor | NotCompared):
        # NotCompared first: it is a dataclass, but its reason is not an output.
        yield path, value
        return
    if isinstance(value, torch.nn.Module):
        if id(value) in seen:
            return
        seen.add(id(value))
        named = set()
        for name, param in value.named_parameters():
            named.add(id(param))
            yield f"{path}.{name}", param
            if param.grad is not None:
                yield f"{path}.{name}.grad", param.grad
        for name, buffer in value.named_buffers():
            named.add(id(buffer))
            yield f"{path}.{name}", buffer
        for prefix, module in value.named_modules():
            where = f"{path}.{prefix}" if prefix else path
            for key, item in module_attributes(module):
                # its own state, not its parameters again (an RNN's _flat_weights)
                if any(id(t) not in named for t in tensors_held(item)):
                    yield from _walk(f"{where}.{key}", item, depth + 1, seen, modules)
        return
    if isinstance(value, torch.optim.Optimizer):
        # the learning rate a scheduler sets: a schedule that differs is a difference of the port
        for index, group in enumerate(value.param_groups):
            lr = group.get("lr")
            if type(lr) is float:
                yield f"{path}.param_groups[{index}]['lr']", lr
        params = [p for group in value.param_groups for p in group["params"]]
        for index, param in enumerate(params):
            for key, item in value.state.get(param, {}).items():
                yield from _walk(f"{path}.state[{index}][{key!r}]", item, depth + 1, seen, modules)
        return
    if _is_numpy_array(value):
        yield path, value
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            yield from _walk(f"{path}.{field.name}", item, depth + 1, seen, modules)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(f"{path}[{key!r}]", item, depth + 1, seen, modules)
        return
    if isinstance(value, list | tuple | collections.deque):
        for index, item in enumerate(value):
            yield from _walk(f"{path}[{index}]", item, depth + 1, seen, modules)
        return
    if isinstance(value, PLAIN_NAMESPACES):
        if id(value) in seen:
            return
        seen.add(id(value))
        for name, item in vars(value).items():
            yield from _walk(f"{path}.{name}", item, depth + 1, seen, modules)
        return
    if isinstance(value, bool | int | float | complex | str | bytes) or value is None:
        yield path, value
        return
    if _is_user_object(value, modules):
        if id(value) in seen:
            return
        seen.add(id(value))
        for name, item in _attributes(value):
            yield from _walk(f"{path}.{name}", item, depth + 1, seen, modules)
        return
    # Anything else (a DataLoader, a function, a library object) is not a numeric output.


def _is_numpy_array(value: Any) -> bool:
    # NumPy arrays and scalars, without importing NumPy.
    return type(value).__module__ == "numpy"


def _is_user_object(value: Any, modules: frozenset[str]) -> bool:
    """An instance of a class the notebook defined (not a class, function or module itself)."""
    # type(f) of a function, class or module is a builtins type, so only instances pass here; a
    # class whose metaclass the notebook defined is still a class.
    return type(value).__module__ in modules and not isinstance(value, type)


def _attributes(value: Any) -> list[tuple[str, Any]]:
    """Instance attributes in definition order: ``__dict__``, then ``__slots__`` that are set."""
    found: dict[str, Any] = {}
    instance_dict = getattr(value, "__dict__", None)
    if isinstance(instance_dict, dict):
        found.update((k, v) for k, v in instance_dict.items() if isinstance(k, str))
    for klass in reversed(type(value).__mro__):
        slots = vars(klass).get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__") or slot in found:
                continue
            try:
                found[slot] = getattr(value, slot)
            except AttributeError:
                continue  # a slot never set
    return [(name, item) for name, item in found.items() if not _is_dunder(name)]


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")
