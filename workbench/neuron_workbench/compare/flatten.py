"""Turn a cell's outputs into leaves with readable paths (``out['logits'][0]``, ``model.fc.weight``).

What is walked, in order of precedence:

- tensors, NumPy arrays and scalars, Python numbers, strings and bytes are leaves, as is ``None``
  bound to a name (a ``None`` inside a structure, a model output's unset field, is no value); a
  NumPy array of what no tensor holds is read as a pandas column is (times as their int64 ticks,
  ``longdouble`` as float64, text and objects as the text of their values);
- a :class:`~neuron_workbench.run.records.NotCompared` marker (an output that could not come back
  from the target's process) is a leaf, so the comparison can say so;
- a leaf tensor's ``.grad`` (``x.grad`` after ``x.requires_grad_()`` and a backward pass);
- ``nn.Module`` parameters, their ``.grad`` and buffers (not a lazy module's before its first
  call: no value yet), and the tensors a module (or one of its submodules) holds as plain
  attributes (a KV cache kept as ``self.kv``); optimizer state;
- dataclasses, mappings, lists, tuples and deques, by field, key and index (a key whose repr is
  its address, or repeats, by its type and position: ``acts[<Linear #2>]``); ``SimpleNamespace`` and
  ``argparse.Namespace`` objects by attribute; pandas DataFrames by column and Series as a column
  (a metrics table), with their index unless it is the default ``0..n-1``, each column one leaf
  (numbers as an array, anything else as its text);
- instances of classes defined in the notebook (a class whose ``__module__`` is one of
  ``user_modules``, ``__main__`` by default), by their instance attributes: ``trainer.model.fc.weight``.
  Every attribute in the instance's ``__dict__`` (and ``__slots__``) is walked, ``_``-names
  included: dataclass fields and module parameters are walked whatever their names, and a model
  kept as ``self._model`` is as much the cell's result as ``self.model``; properties are not
  evaluated. Each object is walked once per output (at its first path), which also ends cycles;
- instances of a library's classes that hold tensors in their attributes (a ``TensorDataset``, a
  ``torch.distributions.Normal``, a transformers ``DynamicCache``: see
  :func:`~neuron_workbench.run.namespace.library_tensor_holder`), by the attributes that hold
  tensors (``ds.tensors[0]``, ``dist.loc``, ``cache.layers[0].keys``): a setting such an object
  keeps (a shape, a flag, a device), or a private attribute (a ``GradScaler``'s ``_scale``), is the
  library's, not the cell's.

Anything else (functions, classes, modules, methods, devices, library objects holding no tensor)
is not a numeric output and yields nothing, as does a notebook object with nothing comparable in it.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import sys
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch

from neuron_workbench.run.measurements import TAGGED, provenance_of, untagged
from neuron_workbench.run.namespace import (
    PLAIN_NAMESPACES,
    TENSOR_HOLDERS,
    holds_tensor_data,
    library_tensor_holder,
    module_attributes,
    tensors_held,
)
from neuron_workbench.run.records import NotCompared

__all__ = ["USER_MODULES", "FlattenedOutputs", "iter_leaves"]

_MAX_DEPTH = 16
#: A lazy module's parameters and buffers before its first call (``nn.LazyLinear``).
_UNINITIALIZED = torch.nn.parameter.UninitializedTensorMixin
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
        yield from _output_leaves(name, value, modules)


def _output_leaves(name: str, value: Any, modules: frozenset[str]) -> list[tuple[str, Any]]:
    """The leaves of one named output (each output is walked on its own: its own ``seen``)."""
    # Into a list: a recursion that appends costs less per leaf than nested generators, each of
    # which a leaf would pass up through.
    leaves: list[tuple[str, Any]] = []
    _walk(leaves, name, value, 0, set(), modules)
    return leaves


class FlattenedOutputs:
    """A run's outputs flattened ahead of their comparison, each output's leaves with its value.

    The reference run ends before the target's answer comes back from its worker: its outputs are
    flattened in that wait, off the time the comparison takes once the answer is there.
    :meth:`leaves` then yields what :func:`iter_leaves` would, walking again only an output bound
    since (``compare_runs`` completes a run's outputs with the other run's names) or bound to
    another object.

    Parameters
    ----------
    outputs : mapping of str to object
        Output name to value, as a run bound them.
    user_modules : collection of str, optional
        As for :func:`iter_leaves`.
    """

    def __init__(
        self, outputs: Mapping[str, Any], *, user_modules: Collection[str] = USER_MODULES
    ) -> None:
        self.user_modules = frozenset(user_modules)
        self._by_name = {
            name: (value, _output_leaves(name, value, self.user_modules))
            for name, value in outputs.items()
        }

    def leaves(self, outputs: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
        """Yield ``(path, leaf)`` for every comparable value under each output, as :func:`iter_leaves`.

        ``outputs`` are the run's outputs now; an output flattened ahead counts as it was then.
        """
        for name, value in outputs.items():
            held = self._by_name.get(name)
            if held is not None and held[0] is value:
                yield from held[1]
            else:
                yield from _output_leaves(name, value, self.user_modules)


def _walk(
    leaves: list[tuple[str, Any]],
    path: str,
    value: Any,
    depth: int,
    seen: set[int],
    modules: frozenset[str],
) -> None:
    """Append ``(path, leaf)`` for every comparable value under ``value`` to ``leaves``."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, _UNINITIALIZED):
        return  # a lazy module's parameter before its first call: no value yet
    if isinstance(value, torch.Tensor | NotCompared):
        # NotCompared first: it is a dataclass, but its reason is not an output.
        leaves.append((path, value))
        # A leaf tensor's gradient (an input's saliency, a hand-written model's weight) is as much
        # the cell's result as a parameter's; a non-leaf has none (reading it warns).
        grad = value.grad if isinstance(value, torch.Tensor) and value.is_leaf else None
        if grad is not None:
            leaves.append((f"{path}.grad", grad))
        return
    if isinstance(value, torch.nn.Module):
        if id(value) in seen:
            return
        seen.add(id(value))
        named = set()
        submodules, parameters, buffers = _module_tree(value)
        for name, param in parameters:
            named.add(id(param))
            if isinstance(param, _UNINITIALIZED):
                continue  # a lazy module's before its first call: no value yet
            leaves.append((f"{path}.{name}", param))
            # (a parameter changed in place by a tensor that requires grad is no leaf: no .grad)
            grad = param.grad if param.is_leaf else None
            if grad is not None:
                leaves.append((f"{path}.{name}.grad", grad))
        for name, buffer in buffers:
            named.add(id(buffer))
            if not isinstance(buffer, _UNINITIALIZED):
                leaves.append((f"{path}.{name}", buffer))
        for prefix, module in submodules:
            where = f"{path}.{prefix}" if prefix else path
            for key, item in _state_attributes(module):
                # its own state, not its parameters again (an RNN's _flat_weights)
                if any(id(t) not in named for t in tensors_held(item)):
                    _walk(leaves, f"{where}.{key}", item, depth + 1, seen, modules)
        return
    if isinstance(value, torch.optim.Optimizer):
        # the learning rate a scheduler sets: a schedule that differs is a difference of the port
        for index, group in enumerate(value.param_groups):
            lr = group.get("lr")
            # a float, or a tensor (capturable and compiled steps; a scheduler fills it in place)
            if type(lr) is float or isinstance(lr, torch.Tensor):
                leaves.append((f"{path}.param_groups[{index}]['lr']", lr))
        params = [p for group in value.param_groups for p in group["params"]]
        for index, param in enumerate(params):
            for key, item in value.state.get(param, {}).items():
                _walk(leaves, f"{path}.state[{index}][{key!r}]", item, depth + 1, seen, modules)
        return
    if isinstance(value, TAGGED) and provenance_of(value) is None:
        # np.zeros(n) the cell filled with no measurement (measurements.py): NumPy's own array
        value = untagged(value)
    if _is_numpy_array(value):
        leaves.append((path, _numpy_leaf(value)))
        return
    if isinstance(value, TAGGED):  # np.array(times): a measurement, kept as one
        leaves.append((path, value))
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            _walk(leaves, f"{path}.{field.name}", item, depth + 1, seen, modules)
        return
    if isinstance(value, Mapping):
        for label, item in zip(_key_labels(value), value.values(), strict=True):
            _walk(leaves, f"{path}[{label}]", item, depth + 1, seen, modules)
        return
    if isinstance(value, list | tuple | collections.deque):
        for index, item in enumerate(value):
            _walk(leaves, f"{path}[{index}]", item, depth + 1, seen, modules)
        return
    if isinstance(value, PLAIN_NAMESPACES):
        if id(value) in seen:
            return
        seen.add(id(value))
        for name, item in vars(value).items():
            _walk(leaves, f"{path}.{name}", item, depth + 1, seen, modules)
        return
    if value is None:
        # A name the cell bound to None is its output; a None inside a structure (the fields a
        # model output leaves unset: no loss without labels, no attentions unless asked) is no
        # value, and counting it as a matched output inflated every report. Where the other run
        # has a value at that path, the comparison says the output is missing on this side.
        if depth == 0:
            leaves.append((path, value))
        return
    if isinstance(value, bool | int | float | complex | str | bytes):
        leaves.append((path, value))
        return
    if isinstance(value, set | frozenset):
        leaves.append((path, _set_leaf(value)))
        return
    if _is_user_object(value, modules):
        if id(value) in seen:
            return
        seen.add(id(value))
        for name, item in _attributes(value):
            _walk(leaves, f"{path}.{name}", item, depth + 1, seen, modules)
        return
    if library_tensor_holder(value):
        # a library's data holder (a TensorDataset, a Normal, a DynamicCache): by the attributes
        # that hold its tensors, as a GPU would have kept them; its settings (a shape, a flag, a
        # device) are the library's, not the cell's
        if id(value) in seen:
            return
        seen.add(id(value))
        for name, item in _attributes(value):
            # a private attribute is the library's bookkeeping (a GradScaler's _scale, which a
            # device without a scaler of its own leaves unset): not what the cell computed
            if not name.startswith("_") and holds_tensor_data(item):
                _walk(leaves, f"{path}.{name}", item, depth + 1, seen, modules)
        return
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(value, pandas.DataFrame | pandas.Series):
        _walk_pandas(leaves, path, value, pandas)
    # Anything else (a DataLoader, a function, a library object) is not a numeric output.


_SET_ITEMS = (bool, int, float, complex, str, bytes, tuple, type(None))


def _set_leaf(value: set[Any] | frozenset[Any]) -> str | NotCompared:
    """A set as the text of its items in order (``{1, 2, 3}``), so two runs' sets compare alike.

    A set has no order of its own (the order of a set of strings differs between processes), so
    its items are sorted, by type name and value, or by repr where values of one type do not
    order; a set holding anything but plain values (tensors, objects) is not compared.
    """
    if not all(isinstance(item, _SET_ITEMS) for item in value):
        return NotCompared("a set of objects (no order to compare them in)")
    try:
        items = sorted(value, key=lambda item: (type(item).__name__, item))
    except TypeError:  # complex numbers, tuples holding None next to numbers
        items = sorted(value, key=lambda item: (type(item).__name__, repr(item)))
    return "{" + ", ".join(map(repr, items)) + "}" if items else "set()"


#: A repr that names where its object lives (``<__main__.Key object at 0x7f...>``, a function's).
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _key_labels(mapping: Mapping[Any, Any]) -> list[str]:
    """How each key of ``mapping`` appears in a path: its repr, or its position where that fails.

    A key whose repr names its address (an object of a class without a ``__repr__``, a function)
    is another string in each run, and keys whose reprs repeat (two ``Linear(4, 4)`` modules
    keying their activations) would give one path to two values: such a key is named by its
    type and its position among the keys (``acts[<Linear #1>]``), which runs that build the
    mapping alike share.
    """
    labels = [repr(key) for key in mapping]
    if not any(_ADDRESS.search(label) for label in labels) and len(set(labels)) == len(labels):
        return labels  # the common case: one pass, nothing to rename
    repeated = {label for label, count in collections.Counter(labels).items() if count > 1}
    return [
        f"<{type(key).__qualname__} #{index}>"
        if label in repeated or _ADDRESS.search(label)
        else label
        for index, (key, label) in enumerate(zip(mapping, labels, strict=True))
    ]


def _walk_pandas(leaves: list[tuple[str, Any]], path: str, value: Any, pandas: Any) -> None:
    """A DataFrame by column (``metrics['loss']``), a Series as one column, and any index but 0..n-1.

    Columns whose labels repeat are named by position (``df.iloc[:, 1]``). Each column is one leaf:
    see :func:`_column_leaf`.
    """
    if isinstance(value, pandas.DataFrame):
        unique = value.columns.is_unique
        columns = [
            (f"{path}[{label!r}]" if unique else f"{path}.iloc[:, {i}]", value.iloc[:, i])
            for i, label in enumerate(value.columns)
        ]
    else:
        columns = [(path, value)]
    index = value.index
    if not (isinstance(index, pandas.RangeIndex) and index.start == 0 and index.step == 1):
        columns.append((f"{path}.index", index))
    for where, column in columns:
        leaves.append((where, _column_leaf(column, pandas)))


def _column_leaf(column: Any, pandas: Any) -> Any:
    """A pandas column (or index) as one leaf: a NumPy array where its values are numbers, else text.

    Times are their int64 ticks; a nullable numeric column is float64 with NaN for its missing
    values; anything else (text, objects, a MultiIndex) is the text of its values, one per line, so
    a dataset's text column is one output compared at once, not one per row.
    """
    array = column.to_numpy()
    kind = array.dtype.kind
    if kind in "biufc":
        # pandas hands out read-only views of its columns, which torch warns about
        return array if array.flags.writeable else array.copy()
    if kind in "mM":
        return array.view("int64").copy()
    api = pandas.api.types
    if api.is_numeric_dtype(column.dtype) or api.is_bool_dtype(column.dtype):
        return column.to_numpy(dtype="float64", na_value=float("nan"))
    return "\n".join(map(str, array.tolist()))


#: Bytes per element of the NumPy floating and complex dtypes a tensor holds (not ``longdouble``).
_TENSOR_ITEMSIZE = {"f": (2, 4, 8), "c": (8, 16)}


def _numpy_leaf(value: Any) -> Any:
    """A NumPy array or scalar as a leaf the comparison can read, as :func:`_column_leaf` does.

    Numbers a tensor can hold stay as they are; times are their int64 ticks, ``longdouble`` and
    ``clongdouble`` are float64 and complex128, and anything else (labels in a ``<U`` array, bytes,
    objects, records) is the text of its values, with their nesting: no tensor holds them, and an
    array of class names is as much the cell's result as a list of them.
    """
    dtype = value.dtype
    kind = dtype.kind
    if kind in "biu" or dtype.itemsize in _TENSOR_ITEMSIZE.get(kind, ()):
        return value
    if kind in "mM":
        return value.astype("int64")  # (astype: a 0-d datetime64 cannot be viewed as int64)
    if kind in "fc":
        return value.astype("float64" if kind == "f" else "complex128")
    return repr(value.tolist())


def _state_attributes(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """What :func:`~neuron_workbench.run.namespace.module_attributes` gives that can hold tensors.

    Most of a module's attributes are settings (``self.width = 4``, a config object): kept out
    here by their type, rather than looked into one by one.
    """
    return [
        (key, item) for key, item in module_attributes(module) if isinstance(item, TENSOR_HOLDERS)
    ]


#: The ``nn.Module`` methods :func:`_module_tree` reads the tree as: a class overriding one is asked.
_MODULE_MEMBERS = ("named_modules", "named_parameters", "named_buffers", "_named_members")


def _module_tree(
    module: torch.nn.Module,
) -> tuple[
    list[tuple[str, torch.nn.Module]],
    list[tuple[str, torch.Tensor]],
    list[tuple[str, torch.Tensor]],
]:
    """``module``'s ``named_modules()``, ``named_parameters()`` and ``named_buffers()``.

    Each of torch's three walks the whole module tree; here the tree is walked once and the
    parameters and buffers are read off it as ``Module._named_members`` does (each tensor once, at
    its first name). A class (or a module itself) that overrides one of these methods gets its own.
    """
    submodules = list(module.named_modules())
    klass, attributes = type(module), vars(module)
    if any(
        name in attributes or getattr(klass, name) is not getattr(torch.nn.Module, name)
        for name in _MODULE_MEMBERS
    ):
        return submodules, list(module.named_parameters()), list(module.named_buffers())
    return submodules, _members(submodules, "_parameters"), _members(submodules, "_buffers")


def _members(
    submodules: list[tuple[str, torch.nn.Module]], table: str
) -> list[tuple[str, torch.Tensor]]:
    """The tensors in each submodule's ``_parameters`` or ``_buffers``, as ``_named_members``."""
    found: list[tuple[str, torch.Tensor]] = []
    memo: set[int] = set()
    for prefix, submodule in submodules:
        for key, tensor in getattr(submodule, table).items():
            if tensor is None or id(tensor) in memo:
                continue
            memo.add(id(tensor))
            found.append((f"{prefix}.{key}" if prefix else key, tensor))
    return found


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
