"""Give each run its own copy of the notebook state the cell touches, on the run's device."""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import copyreg
import dataclasses
import enum
import functools
import random
import re
import sys
import tempfile
import types
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from neuron_workbench.quiet import warnings_ignored
from neuron_workbench.run.device_origin import ORIGIN_ATTR
from neuron_workbench.run.exported_programs import EXPORTED_PROGRAM, program_moved, program_tensors
from neuron_workbench.run.grad_scalers import (
    GRAD_SCALER,
    ScalerMidStep,
    deepcopy_grad_scaler,
    mid_step_message,
)
from neuron_workbench.run.loader_workers import (
    has_started_workers,
    loader_copied_past_its_workers,
)
from neuron_workbench.run.notebook_handles import (
    FILE_TYPES,
    bar_kept_apart,
    is_notebook_file,
    kept_apart,
    progress_bar_class,
)
from neuron_workbench.run.random_state import RANDOM_MODULE_GENERATOR
from neuron_workbench.run.torchscript import (
    SCRIPT_MODULES,
    reduce_script_module,
    script_constants,
)
from neuron_workbench.run.unversioned_writes import UnversionedWrites

_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device, range)
_NEVER_COPIED = (
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    type,
    # a handle of a folder on disk: a copy names the same folder, and the original, swapped out
    # of the namespace for it, had its finalizer delete the folder
    tempfile.TemporaryDirectory,
)


def _instance_check(classes: tuple[type, ...]) -> Callable[[Any], bool]:
    """``isinstance(value, classes)`` as a function that asks ``value.__class__`` once.

    ``isinstance`` asks for it (a proxy may claim a class it is not an instance of) once per class
    that ``value``'s type is not a subclass of: for a library object whose ``__getattribute__`` is
    Python code (a transformers config, held by every layer of a model) that is a Python call per
    class, and :func:`needs_copy` cost 14 µs. Classes whose metaclass has an ``__instancecheck__``
    of its own (``torch.Generator``'s) are asked through ``isinstance``.
    """
    plain = tuple(each for each in classes if type(each) is type)
    others = tuple(each for each in classes if type(each) is not type)

    def instance_of(value: Any) -> bool:
        kind = type(value)
        if issubclass(kind, plain):
            return True
        try:
            claimed = value.__class__
        except AttributeError:  # as isinstance takes it
            claimed = kind
        if claimed is not kind and isinstance(claimed, type) and issubclass(claimed, plain):
            return True
        return bool(others) and isinstance(value, others)

    return instance_of


_never_state = _instance_check(_IMMUTABLE + _NEVER_COPIED)


def needs_copy(value: Any) -> bool:
    """False for values a run cannot change in place (numbers, strings, functions, classes).

    A notebook function whose closure holds state (``step = make_step(model, opt)``), a method
    bound to such state (``trainer.fit``) and a compiled one (``torch.compile(model.forward)``)
    are state: each run gets its own, around its copies.
    """
    kind = type(value)
    if kind in _ATOMS:
        return False
    if kind is types.FunctionType:
        return bool(_closure_state(value)) or compiled_over_state(value) is not None
    if kind is types.MethodType:
        return needs_copy(value.__self__)
    if value is RANDOM_MODULE_GENERATOR:
        # `from random import shuffle`: the module's own generator, whose state each run starts
        # from and the kept run leaves (run/random_state.py); a copy would cut the name off it
        return False
    return not _never_state(value)


def _closure_state(function: types.FunctionType, depth: int = 0) -> list[Any]:
    """What a notebook function's closure holds that a run can change in place (else empty).

    That includes a notebook function holding state itself (a wrapper around ``make_step(...)``'s
    step). Library functions (torch's, a compiled function's Dynamo state) are left as they are.
    """
    if (
        depth > 4  # a closure holding itself (a recursive inner function)
        or function.__closure__ is None
        or not notebook_function(function)
    ):
        return []
    held = []
    for cell in function.__closure__:
        try:
            contents = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        if type(contents) is types.FunctionType:
            if contents is not function and _closure_state(contents, depth + 1):
                held.append(contents)
        elif needs_copy(contents):
            held.append(contents)
    return held


def notebook_function(function: types.FunctionType, module_name: str = "__main__") -> bool:
    """Whether ``function`` is the notebook's own (its globals are those of ``module_name``).

    Not a library's wrapper of one (``functools.wraps`` gives it the notebook's ``__module__``), nor
    a compiled function (Dynamo's state is in its closure).
    """
    return function.__globals__.get(
        "__name__"
    ) == module_name and "_torchdynamo_orig_callable" not in vars(function)


def compiled_over_state(function: types.FunctionType) -> Any:
    """What a ``torch.compile``'d function compiled, when that holds state (else None).

    ``torch.compile(model.forward)`` (also set as ``model.forward``) compiles a method bound to the
    model: the run's copy compiles the method of the run's copy of the model again. Only a compile
    whose request was remembered (after ``%load_ext``) can be made again.
    """
    attributes = vars(function)
    original = attributes.get("_torchdynamo_orig_callable")
    if original is None or COMPILE_REQUEST_ATTR not in attributes:
        return None
    return original if needs_copy(original) else None


def function_like(
    function: types.FunctionType,
    globals_: dict[str, Any],
    closure: tuple[types.CellType, ...] | None,
) -> types.FunctionType:
    """``function`` made again over ``globals_`` and ``closure``.

    Its code, defaults, names and attributes are the same.
    """
    result = types.FunctionType(
        function.__code__, globals_, function.__name__, function.__defaults__, closure
    )
    result.__kwdefaults__ = function.__kwdefaults__
    result.__qualname__ = function.__qualname__
    result.__module__ = function.__module__
    result.__doc__ = function.__doc__
    result.__dict__.update(function.__dict__)
    return result


def held_values(value: Any) -> list[Any]:
    """What a callable holds that is state: a closure's, a bound method's self, a partial's arguments.

    Empty for anything else.
    """
    kind = type(value)
    if kind is types.FunctionType:
        compiled = compiled_over_state(value)
        return [compiled] if compiled is not None else _closure_state(value)
    if kind is types.MethodType:
        return [value.__self__]
    if kind is functools.partial:
        return [*value.args, *value.keywords.values()]
    return []


#: What ``nn.Module`` itself keeps in an instance's ``__dict__`` (parameters, buffers, submodules,
#: hooks, the training flag); every other attribute is the module class's own.
MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))
#: Objects that are only a bag of attributes (a script's parsed arguments, a config namespace).
PLAIN_NAMESPACES = (types.SimpleNamespace, argparse.Namespace)


def attributes_are_state(value: Any) -> bool:
    """Whether ``value``'s attributes are the cell's values: a notebook object or a namespace.

    (:func:`user_object`, one of :data:`PLAIN_NAMESPACES`, or a :func:`library_tensor_holder`.)
    Their attributes are walked, moved, compared and committed as the cell's own values are.
    """
    return user_object(value) or isinstance(value, PLAIN_NAMESPACES) or library_tensor_holder(value)


#: Instances of these are never a :func:`library_tensor_holder`: what the walks treat as such
#: already (modules, optimizers, containers), or what holds no state of the cell's.
_NOT_TENSOR_HOLDERS = (
    torch.Tensor,
    torch.nn.Module,
    torch.optim.Optimizer,
    dict,
    list,
    tuple,
    set,
    frozenset,
    collections.deque,
    type,
    types.ModuleType,
    types.FunctionType,
    types.MethodType,
    functools.partial,
    enum.Enum,
    *PLAIN_NAMESPACES,
)
#: How deep :func:`library_tensor_holder` looks (containers and library objects inside one), and
#: how many values it looks at in all: a tokenizer's vocabulary is no place to look for tensors.
_HOLDER_DEPTH = 4
_HOLDER_LOOKS = 1_000


def library_tensor_holder(value: Any) -> bool:
    """Whether ``value`` is an instance of a library's class that holds tensors in its attributes.

    Parameters
    ----------
    value : object
        Any value a cell bound or read.

    Returns
    -------
    bool
        True for an object of a class an installed module defines (not the notebook's, not a
        builtin, not the workbench's own) whose ``__dict__`` holds a tensor, directly, in lists,
        tuples, deques, sets or dict values, or in another such object's attributes, a few levels
        deep: ``TensorDataset.tensors``, ``Normal.loc``, a ``DynamicCache``'s
        ``layers[i].keys``. Modules and optimizers are not (they are walked as what they are),
        nor is what holds one (an LR scheduler): only tensors make a data holder.

    Notes
    -----
    On a GPU such an object's tensors stay where the cell put them; on the CPU standing in for
    cuda they come back as CPU tensors, so the object is walked, moved and compared through its
    attributes as a notebook object is (:func:`attributes_are_state`).
    """
    if not _library_class(type(value)):
        return False
    attributes = _own_attributes(value)
    return attributes is not None and _finds_tensor(attributes.values(), _HOLDER_DEPTH, [0])


def holds_tensor_data(value: Any) -> bool:
    """Whether ``value`` is a tensor or holds one, looking as :func:`library_tensor_holder` does.

    Parameters
    ----------
    value : object
        An attribute of a library's tensor holder.

    Returns
    -------
    bool
        True for a tensor, and for a container or library object with a tensor inside (a few
        levels deep); False for a setting (a shape, a flag, a device, a config object).
    """
    return _finds_tensor((value,), _HOLDER_DEPTH, [0])


_NOT_LIBRARIES = frozenset({"builtins", "__main__"})


def _own_attributes(value: Any) -> dict[str, Any] | None:
    """``vars(value)`` where it is a plain dict, else None (a proxy's own ``__dict__`` may raise)."""
    try:
        attributes = vars(value)
    except Exception:  # no __dict__ (a C type), or a proxy refusing the question
        return None
    return attributes if type(attributes) is dict else None


def _finds_tensor(items: Iterable[Any], depth: int, looked: list[int]) -> bool:
    """Whether a tensor is among ``items`` or inside them, as :func:`library_tensor_holder` looks."""
    for item in items:
        looked[0] += 1
        if looked[0] > _HOLDER_LOOKS:
            return False
        kind = type(item)
        if kind in _ATOMS:
            continue
        if isinstance(item, torch.Tensor):
            return True
        if depth <= 0 or issubclass(kind, torch.nn.Module | torch.optim.Optimizer):
            continue
        if issubclass(kind, dict):
            inside: Iterable[Any] | None = item.values()
        elif issubclass(kind, list | tuple | set | frozenset | collections.deque):
            inside = item
        elif _library_class(kind):
            inside = (_own_attributes(item) or {}).values()
        else:
            inside = None
        if inside is not None and _finds_tensor(inside, depth - 1, looked):
            return True
    return False


def _library_class(kind: type) -> bool:
    """Whether instances of ``kind`` may be a :func:`library_tensor_holder` (by their class alone).

    Not the notebook's classes nor dataclasses (:func:`user_object` already), nor the workbench's
    own (a report kept with ``-o`` holds runs' outputs, not state).
    """
    module = kind.__module__
    return not (
        kind in _ATOMS
        or not isinstance(module, str)
        or module in _NOT_LIBRARIES
        or module.startswith("neuron_workbench.")
        or issubclass(kind, _NOT_TENSOR_HOLDERS)
        or dataclasses.is_dataclass(kind)
    )


def module_attributes(module: torch.nn.Module) -> Iterator[tuple[str, Any]]:
    """The attributes ``module``'s class set on it (a KV cache kept as ``self.kv``, a setting)."""
    return ((k, v) for k, v in vars(module).items() if k not in MODULE_INTERNALS)


#: What :func:`tensors_held` looks into (a tensor is itself): a value of any other type (a setting,
#: a config object) holds no tensor for it.
TENSOR_HOLDERS = (torch.Tensor, dict, list, tuple, collections.deque)
_CONTAINERS = TENSOR_HOLDERS[2:]  # held items: list, tuple, deque (and a dict's values)


def tensors_held(value: Any, depth: int = 3) -> Iterator[torch.Tensor]:
    """The tensors ``value`` is, or holds in lists, tuples, deques and dict values (a few deep).

    What a module's plain attribute holds as state: a KV cache ``self.kv``, ``self.past = [(k,
    v)]``; not a setting (``self.width = 4``) nor a library object (see :data:`TENSOR_HOLDERS`).
    """
    if isinstance(value, torch.Tensor):
        yield value
    elif depth > 0:
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, _CONTAINERS):
            return
        for item in value:
            if type(item) not in _ATOMS:  # (a number holds none: no generator for it)
                yield from tensors_held(item, depth - 1)


def holds_tensors(value: Any, depth: int = 3) -> bool:
    """Whether :func:`tensors_held` finds any (looking as it does, without its generators)."""
    if type(value) in _ATOMS:
        return False
    if isinstance(value, torch.Tensor):
        return True
    if depth <= 0:
        return False
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, _CONTAINERS):
        return False
    for item in value:
        if holds_tensors(item, depth - 1):
            return True
    return False


def _modules_of(module: torch.nn.Module) -> list[torch.nn.Module]:
    """``module`` and its submodules, each once (``Module.modules()`` without building names)."""
    found: list[torch.nn.Module] = []
    seen: set[int] = set()
    todo = [module]
    while todo:
        each = todo.pop()
        if id(each) in seen:
            continue
        seen.add(id(each))
        found.append(each)
        todo.extend(reversed([m for m in each._modules.values() if m is not None]))
    return found


def user_object(value: Any) -> bool:
    """Whether ``value`` is an instance of a notebook class or a dataclass: its attributes are state."""
    kind = type(value)
    return (kind.__module__ == "__main__" and not isinstance(value, type)) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )


def isolate(
    namespace: Mapping[str, Any], names: Iterable[str], *, files_apart: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """Deep-copy the values of ``names`` together, so objects that share state still share it.

    Returns the copies and the names whose value could not be copied (they are shared between the
    two runs, and the report says so). A file the notebook holds open for writing, or a progress
    bar, is no copy: it is the object itself, or with ``files_apart`` (a run that is not kept) a
    stand-in that keeps what the run does apart (:mod:`~neuron_workbench.run.notebook_handles`).
    """
    wanted = {n: namespace[n] for n in sorted(names) if n in namespace and needs_copy(namespace[n])}
    if not files_apart:  # a new kept run: the last one's files are no longer this cell's
        _KEPT_RUN_FILES.clear()
    _FILES_APART.append(files_apart)
    _PROGRESS_BAR.append(progress_bar_class())
    try:
        # what making a copy warns was shown when the notebook made the original: a copy of
        # ctx = torch.cuda.amp.autocast() (a deprecated class, which warns when made) showed its
        # FutureWarning in every cell, at copyreg's line
        with warnings_ignored():
            return _isolated(wanted)
    finally:
        _FILES_APART.pop()
        _PROGRESS_BAR.pop()


def _isolated(wanted: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    with _copies_keep_state():
        try:
            return _deepcopy(wanted, {}), []
        except Exception:  # one value refuses deepcopy (a generator, a file): copy one by one
            copies: dict[str, Any] = {}
            shared: list[str] = []
            memo: dict[int, Any] = {}
            for name, value in wanted.items():
                try:
                    copies[name] = _deepcopy_or_undo(value, memo)
                except ScalerMidStep:
                    # shared, both runs would step it: the second unscales the gradients again
                    raise ScalerMidStep(mid_step_message(name)) from None
                except Exception:
                    shared.append(name)
            return copies, shared


def _deepcopy_or_undo(value: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy(value, memo)``; if it fails, the memo is left as it was, and it raises.

    A copy that fails part way has put half-built objects in the memo (a trainer whose attributes
    were never set): another value copied with the same memo would get them as its copies.
    """
    known = len(memo)
    try:
        return _deepcopy(value, memo)
    except Exception:
        for key in list(memo)[known:]:  # a dict keeps insertion order: what this copy added
            del memo[key]
        raise


_MISSING = object()
#: Types ``copy.deepcopy`` returns as they are, without looking at the memo.
_COPIED_AS_THEMSELVES = frozenset({type(None), bool, int, float, complex, str, bytes})


def _deepcopy(value: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy(value, memo)``, faster for what a model and its optimizer are made of.

    The same steps in the same order, with the same memo entries for every object the copy can
    meet again: dicts, lists, tuples, ordered dicts (a module's hooks) and sets of constants are
    copied here rather than through ``copy``'s generic reduce-and-reconstruct machinery (an empty
    ``OrderedDict`` alone costs a ``__reduce_ex__`` and a ``copyreg._slotnames`` call), and what
    objects hold is copied by this function again, ``copy._reconstruct`` included. Used under
    :func:`_copies_keep_state` only: a run's isolation copies thousands of objects per cell.
    """
    kind = type(value)
    if kind in _COPIED_AS_THEMSELVES:
        return value
    key = id(value)
    result = memo.get(key, _MISSING)
    if result is not _MISSING:
        return result
    copier = _FAST_COPIERS.get(kind) or copy._deepcopy_dispatch.get(kind)  # type: ignore[attr-defined]
    if copier is not None:
        result = copier(value, memo)
    elif issubclass(kind, type):
        result = value
    elif _PROGRESS_BAR[-1] is not None and isinstance(value, _PROGRESS_BAR[-1]):
        # the notebook's progress bar: itself in the kept run, else a stand-in it moves
        result = bar_kept_apart(value) if _FILES_APART[-1] else value
    elif has_started_workers(value):
        # a loader whose persistent workers run: a copy without them, which starts its own, as
        # the target's copy does (the notebook's workers, shared with this run, went on with
        # random streams the target's could not continue)
        result = loader_copied_past_its_workers(value, memo, _deepcopy)
    else:
        method = getattr(value, "__deepcopy__", None)
        if method is not None:
            result = method(memo)
        else:  # _deepcopy_as_copy_does, written out: one frame less per level of a deep object
            reductor = copyreg.dispatch_table.get(kind)
            reduced = reductor(value) if reductor is not None else value.__reduce_ex__(4)
            result = (
                value
                if isinstance(reduced, str)
                else copy._reconstruct(value, memo, *reduced, deepcopy=_deepcopy)  # type: ignore[attr-defined]
            )
    if result is not value:
        memo[key] = result
        try:  # alive with the memo, as copy._keep_alive keeps it: its id is a memo key
            memo[id(memo)].append(value)
        except KeyError:
            memo[id(memo)] = [value]
    return result


def _deepcopy_list(value: list[Any], memo: dict[int, Any]) -> list[Any]:
    result: list[Any] = []
    memo[id(value)] = result
    append = result.append
    for item in value:
        append(item if type(item) in _COPIED_AS_THEMSELVES else _deepcopy(item, memo))
    return result


def _deepcopy_tuple(value: tuple[Any, ...], memo: dict[int, Any]) -> tuple[Any, ...]:
    items = [_deepcopy(item, memo) for item in value]
    # a tuple is not in the memo, unless an item holding it copied it already (a cycle)
    try:
        return memo[id(value)]
    except KeyError:
        pass
    for item, original in zip(items, value, strict=True):
        if item is not original:
            return tuple(items)
    return value


def _deepcopy_dict(value: dict[Any, Any], memo: dict[int, Any]) -> dict[Any, Any]:
    # (Constants, most keys and many items, are themselves, without a call: a model's modules hold
    # thousands. The loop is here, not in a helper, so a deep structure takes the frames per level
    # copy.deepcopy takes: RecursionError at the same depth.)
    result: dict[Any, Any] = {}
    memo[id(value)] = result
    atoms = _COPIED_AS_THEMSELVES
    for key, item in value.items():
        # each item before its key, as copy's `y[deepcopy(key)] = deepcopy(value)` evaluates them
        item = item if type(item) in atoms else _deepcopy(item, memo)
        result[key if type(key) in atoms else _deepcopy(key, memo)] = item
    return result


def _deepcopy_ordered_dict(
    value: collections.OrderedDict[Any, Any], memo: dict[int, Any]
) -> collections.OrderedDict[Any, Any]:
    if vars(value):  # attributes set on it: their copies too, as copy does
        return _deepcopy_as_copy_does(value, memo)
    # what copy._reconstruct makes of OrderedDict.__reduce__'s (OrderedDict, (), None, None, items)
    result: collections.OrderedDict[Any, Any] = collections.OrderedDict()
    memo[id(value)] = result
    atoms = _COPIED_AS_THEMSELVES
    for key, item in value.items():  # (a module's hooks, mostly none) each key before its item
        key = key if type(key) in atoms else _deepcopy(key, memo)
        result[key] = item if type(item) in atoms else _deepcopy(item, memo)
    return result


def _deepcopy_set(value: set[Any], memo: dict[int, Any]) -> set[Any]:
    if all(type(item) in _COPIED_AS_THEMSELVES for item in value):
        # what copy._reconstruct makes of set.__reduce__'s (set, (list(value),), None)
        return set(list(value))
    return _deepcopy_as_copy_does(value, memo)


def _deepcopy_method(value: types.MethodType, memo: dict[int, Any]) -> types.MethodType:
    return type(value)(value.__func__, _deepcopy(value.__self__, memo))


def _deepcopy_script_module(value: Any, memo: dict[int, Any]) -> Any:
    """A scripted module's copy whose parameters and buffers are the copies the memo gives.

    torch's own deepcopy of a scripted module clones its tensors past the memo, as results of a
    clone: no leaves, and not the tensors the optimizer's copy holds, so a run's step changed
    nothing its model used.
    """
    rebuild, (archive, tensors, *rest) = reduce_script_module(value)
    return rebuild(
        archive, {path: _deepcopy(tensor, memo) for path, tensor in tensors.items()}, *rest
    )


#: ``copy``'s own copiers of these exact types, copying what they hold with :func:`_deepcopy`.
_FAST_COPIERS: dict[type, Callable[[Any, dict[int, Any]], Any]] = {
    list: _deepcopy_list,
    tuple: _deepcopy_tuple,
    dict: _deepcopy_dict,
    collections.OrderedDict: _deepcopy_ordered_dict,
    set: _deepcopy_set,
    types.MethodType: _deepcopy_method,
    # a folder's handle, wherever it is held (its own copy's swap had its finalizer delete it)
    tempfile.TemporaryDirectory: lambda value, memo: value,
}


def _copy_of_file(value: Any, memo: dict[int, Any]) -> Any:
    """The notebook's open file as a run sees it: itself in the kept run, else kept apart."""
    if not _FILES_APART[-1]:
        if is_notebook_file(value):
            _KEPT_RUN_FILES[id(value)] = value
            return value
    elif is_notebook_file(value) or (
        # the kept run ran first, here, and closed it: it was open when the cell began
        _KEPT_RUN_FILES.get(id(value)) is value and is_notebook_file(value, open_only=False)
    ):
        return kept_apart(value)
    raise TypeError(f"cannot copy {type(value).__name__} object")  # shared, as before


_FAST_COPIERS.update(dict.fromkeys(FILE_TYPES, _copy_of_file))
_FAST_COPIERS.update(dict.fromkeys(SCRIPT_MODULES, _deepcopy_script_module))
#: Whether the copies being made are for a run whose writes are kept apart (innermost last).
_FILES_APART: list[bool] = [False]
#: tqdm's progress bar class while copies are made (None where tqdm is not loaded).
_PROGRESS_BAR: list[Any] = [None]
#: The notebook's open files the last kept run here was given (this cell's, once it has run).
_KEPT_RUN_FILES: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _deepcopy_function(value: types.FunctionType, memo: dict[int, Any]) -> types.FunctionType:
    """A notebook function holding state, around copies of what it holds (else the function).

    ``copy.deepcopy`` leaves functions as they are: a training step made by a factory
    (``step = make_step(model, opt)``), or a forward hook appending to a list, went on reaching
    the notebook's objects from the run's copy. A compiled function of such state
    (``model.forward = torch.compile(model.forward)``) is compiled again over the copy of what it
    compiled: it went on running the notebook's model, whose gradients the run's copy never got.
    """
    compiled = compiled_over_state(value)
    if compiled is not None:
        request = vars(value)[COMPILE_REQUEST_ATTR]
        result = torch.compile(_deepcopy(compiled, memo), **compile_request_here(request))
        object.__setattr__(result, COMPILE_REQUEST_ATTR, request)
        memo[id(value)] = result
        memo.setdefault(id(memo), []).append(value)  # alive with the memo (its id is a key)
        return result
    if not _closure_state(value):
        return value
    assert value.__closure__ is not None
    cells = tuple(types.CellType() for _ in value.__closure__)
    result = function_like(value, value.__globals__, cells)
    memo[id(value)] = result
    memo.setdefault(id(memo), []).append(value)  # alive with the memo (its id is a key)
    for cell, new in zip(value.__closure__, cells, strict=True):
        try:
            contents = cell.cell_contents
        except ValueError:  # a cell not filled yet stays empty
            continue
        try:
            new.cell_contents = _deepcopy_or_undo(contents, memo)
        except Exception:  # an open file, a lock: shared by the runs, as the function was
            new.cell_contents = contents
    return result


def _deepcopy_parameter(param: torch.nn.Parameter, memo: dict[int, Any]) -> torch.nn.Parameter:
    """A parameter's deep copy with its gradient, its attributes and its storage's other views."""
    if id(param) in memo:
        return memo[id(param)]
    # Tensor.__deepcopy__ of the data goes through the memo by storage, so a view of the parameter
    # copied in the same call stays a view of the copy. ``param.data`` is a new object each time:
    # it is kept alive with the memo (as copy._keep_alive does), or its id, a memo key, is reused.
    data = param.data
    memo.setdefault(id(memo), []).append(data)
    copied = data.__deepcopy__(memo)
    if copied.is_inference():
        # a parameter made under inference mode (rare) is copied as a normal one, as PyTorch copies
        # it: on a GPU `model.cuda()` gives it normal data, on the host standing in for cuda it
        # does nothing, and the run could not train it
        copied = copied.clone()
    result = type(param)(copied, param.requires_grad)
    # its hooks with the run's copies of what they hold (a gradient recorder's list)
    add_leaf_hooks(result, _deepcopy(leaf_hooks(param), memo))
    memo[id(param)] = result
    if param.grad is not None:
        result.grad = _deepcopy(param.grad, memo)
    if param.__dict__:
        result.__dict__.update(_deepcopy(param.__dict__, memo))
    return result


#: What ``torch.compile`` was asked for, kept on what it returned
#: (:func:`~neuron_workbench.run.transport.remember_compile_requests`).
COMPILE_REQUEST_ATTR = "_workbench_compile_request"


def compile_request_here(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` as this process's ``torch.compile`` can take it (a remembered request).

    A backend named by a string that only the process which compiled has registered would fail
    the compile made again here (``InvalidBackend``): transformers' ``generate()`` with a static
    cache compiles the model's forward with ``backend="neuron"`` on a Neuron device, and the
    target's answer bringing that model back could not be loaded in the kernel (ERROR). Such a
    name becomes a backend that looks it up when a graph first compiles: a call here fails as in
    any process without that backend, and the request remembered keeps the name, which a target's
    process compiles with again.

    Parameters
    ----------
    request : dict
        The keyword arguments ``torch.compile`` was given.

    Returns
    -------
    dict
        ``request`` itself, or a copy whose ``backend`` is looked up by name at its first compile.
    """
    backend = request.get("backend")
    if not isinstance(backend, str) or _backend_registered(backend):
        return request
    return {**request, "backend": _backend_named_later(backend)}


def _backend_registered(name: str) -> bool:
    """Whether Dynamo knows a backend called ``name`` in this process."""
    from torch._dynamo.backends.registry import lookup_backend
    from torch._dynamo.exc import InvalidBackend

    try:
        lookup_backend(name)
    except InvalidBackend:
        return False
    return True


@functools.cache
def _backend_named_later(name: str) -> Callable[..., Any]:
    """A Dynamo backend that is the one called ``name`` when a graph compiles (one per name).

    One object per name, as Dynamo's cached code guards on its backend's identity.
    """

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(name)(gm, example_inputs, **kwargs)

    backend.__name__ = name
    return backend


def compile_in_place_again(module: torch.nn.Module, request: dict[str, Any]) -> None:
    """``module.compile(**request)`` in this process, remembering ``request`` as it was given."""
    module.compile(**compile_request_here(request))
    # (what this process's torch.compile remembered may name a backend looked up later)
    with contextlib.suppress(AttributeError, TypeError):
        object.__setattr__(vars(module)["_compiled_call_impl"], COMPILE_REQUEST_ATTR, request)


def compile_request_in_place(module: torch.nn.Module) -> dict[str, Any] | None:
    """What ``module.compile()`` was asked for (None: not compiled in place, or not remembered)."""
    compiled = vars(module).get("_compiled_call_impl")
    attributes = getattr(compiled, "__dict__", None)
    if not isinstance(attributes, dict):
        return None
    return attributes.get(COMPILE_REQUEST_ATTR)


def _deepcopy_as_copy_does(value: Any, memo: dict[int, Any]) -> Any:
    """What ``copy.deepcopy`` makes of an object without a ``__deepcopy__`` of its own.

    What it holds is copied by :func:`_deepcopy`.
    """
    reductor = copyreg.dispatch_table.get(type(value))
    reduced = reductor(value) if reductor is not None else value.__reduce_ex__(4)
    if isinstance(reduced, str):  # a global, as copy.deepcopy treats it
        return value
    return copy._reconstruct(value, memo, *reduced, deepcopy=_deepcopy)  # type: ignore[attr-defined]


def _deepcopy_module(self: torch.nn.Module, memo: dict[int, Any]) -> torch.nn.Module:  # noqa: N807
    """A module's deep copy as ``copy.deepcopy`` makes it, compiled again if it was in place.

    ``Module.__getstate__`` drops what ``model.compile()`` set: without this, every run of a later
    cell would use an eager copy of a model the notebook compiled. A ``torch.compile(model)``
    wrapper keeps what it was asked for (its ``__reduce__`` drops it): the reference's copy is
    committed, and a later cell sends it to a worker, which compiles it with the target's backend.
    """
    result = _deepcopy_as_copy_does(self, memo)
    if result is self:
        return result
    if vars(self).get("_compiled_call_impl") is not None:
        request = compile_request_in_place(self)
        if request is not None:
            compile_in_place_again(result, request)
    asked = vars(self).get(COMPILE_REQUEST_ATTR)
    if asked is not None and COMPILE_REQUEST_ATTR not in vars(result):
        object.__setattr__(result, COMPILE_REQUEST_ATTR, asked)
    if "_torchdynamo_wrapper_id" in vars(self):
        _mark_compiled_copy(self, result, memo)
    return result


def _mark_compiled_copy(value: Any, result: Any, memo: dict[int, Any]) -> None:
    """Mark the copy of a ``torch.compile``'d module as the compiled wrapper it stands for.

    Dynamo tells its own wrapper by ``_torchdynamo_wrapper_id == id(wrapper)``, which the copy
    (rebuilt by ``OptimizedModule.__reduce__``) lacks: ``torch.compile(model)`` again on a copy
    wrapped it twice, where on the notebook's own object torch gives the compiled forward
    (a cell ``model = torch.compile(model)`` run again was a FAIL, its paths ``_orig_mod._orig_mod``).
    """
    attributes = vars(value)
    if attributes["_torchdynamo_wrapper_id"] != id(value):  # a copied mark: not its own either
        return
    original = attributes.get("_torchdynamo_orig_callable")
    with contextlib.suppress(AttributeError, TypeError):
        object.__setattr__(result, "_torchdynamo_orig_callable", _deepcopy(original, memo))
        object.__setattr__(result, "_torchdynamo_wrapper_id", id(result))


def leaf_hooks(tensor: torch.Tensor) -> tuple[dict[Any, Any] | None, dict[Any, Any] | None] | None:
    """A leaf tensor's gradient hooks and post-accumulate-grad hooks (None: none).

    PyTorch's copies (deep copies, ``.to``, pickling) leave them behind: a parameter whose gradient
    a hook zeroes or clips had no hook in either run, nor in the notebook after the commit. They are
    the dicts PyTorch keeps them in, keyed by their handles' ids: copied together with a handle
    (``h = w.register_hook(...)``), the copy of the handle removes the hook from the copy.
    """
    if not tensor.is_leaf:
        return None
    backward = tensor._backward_hooks
    accumulated = getattr(tensor, "_post_accumulate_grad_hooks", None)
    if not backward and not accumulated:
        return None
    return backward or None, accumulated or None


def add_leaf_hooks(
    tensor: torch.Tensor, hooks: tuple[dict[Any, Any] | None, dict[Any, Any] | None] | None
) -> None:
    """Give ``tensor`` (a copy of another) :func:`leaf_hooks` of the other, in their dicts."""
    if hooks is None or not tensor.requires_grad:
        return
    backward, accumulated = hooks
    if backward:
        for key, hook in (tensor._backward_hooks or {}).items():  # its own (a guard) stay
            backward.setdefault(key, hook)
        tensor._backward_hooks = backward
    if accumulated:
        for key, hook in (getattr(tensor, "_post_accumulate_grad_hooks", None) or {}).items():
            accumulated.setdefault(key, hook)
        tensor._post_accumulate_grad_hooks = accumulated  # torch registers what it is set to


#: An optimizer's hooks, which ``Optimizer.__getstate__`` leaves out of copies and pickles.
_OPTIMIZER_HOOKS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


def optimizer_extras(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What ``Optimizer.__getstate__`` drops that the notebook's optimizer has (empty: nothing).

    Its hooks (an EMA update registered with ``register_step_post_hook``), and an LR scheduler's
    watch on ``step`` (without it each copy's ``scheduler.step()`` warns that ``optimizer.step()``
    was overridden).
    """
    attributes = vars(optimizer)
    # the dicts themselves: a handle copied along (register_step_post_hook's) keeps reaching them
    extras: dict[str, Any] = {
        key: attributes[key] for key in _OPTIMIZER_HOOKS if attributes.get(key)
    }
    if "_opt_called" in attributes:
        extras["_opt_called"] = attributes["_opt_called"]
    if getattr(attributes.get("step"), "_wrapped_by_lr_sched", False):
        extras["step"] = True
    return extras


def restore_optimizer_extras(optimizer: torch.optim.Optimizer, extras: dict[str, Any]) -> None:
    """Give a copy of an optimizer what :func:`optimizer_extras` found on its original."""
    attributes = vars(optimizer)
    for key in _OPTIMIZER_HOOKS:
        if key in extras:
            attributes[key] = extras[key]
    if "_opt_called" in extras:
        attributes["_opt_called"] = extras["_opt_called"]
    if extras.get("step"):
        _watched_by_lr_scheduler(optimizer)


def _watched_by_lr_scheduler(optimizer: torch.optim.Optimizer) -> None:
    """Wrap ``optimizer.step`` as an LR scheduler does at its creation (it notes each call)."""
    step = type(optimizer).step
    optimizer_ref = weakref.ref(optimizer)

    @functools.wraps(step)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        watched = optimizer_ref()
        watched._opt_called = True  # type: ignore[union-attr]
        return step(watched, *args, **kwargs)

    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = wrapper  # type: ignore[method-assign]


def _deepcopy_optimizer(self: torch.optim.Optimizer, memo: dict[int, Any]) -> Any:  # noqa: N807
    """An optimizer's deep copy as ``copy.deepcopy`` makes it, with :func:`optimizer_extras`."""
    result = _deepcopy_as_copy_does(self, memo)
    extras = optimizer_extras(self) if result is not self else {}
    if extras:  # its hooks with the run's copies of what they hold (an EMA model)
        restore_optimizer_extras(result, _deepcopy(extras, memo))
    return result


@contextlib.contextmanager
def _copies_keep_state() -> Iterator[None]:
    """While the body runs, deep copies keep what PyTorch's own would lose.

    ``Parameter.__deepcopy__`` keeps ``.grad``: PyTorch's copies the data alone, and gradients
    accumulated over earlier cells (gradient accumulation, a cell that steps after a cell that ran
    backward) would be lost in the run's copy, and in what it commits back to the notebook. A tensor
    an autograd graph computed is copied (:func:`_deepcopy_tensor_of_a_graph`), a module
    compiled in place stays compiled (:func:`_deepcopy_module`), and an optimizer keeps its hooks
    and its LR scheduler's watch (:func:`_deepcopy_optimizer`), and a ``GradScaler`` the scale it
    had (:func:`~neuron_workbench.run.grad_scalers.deepcopy_grad_scaler`).
    """
    module_copier = vars(torch.nn.Module).get("__deepcopy__")
    optimizer_copier = vars(torch.optim.Optimizer).get("__deepcopy__")
    scaler_copier = vars(GRAD_SCALER).get("__deepcopy__")
    original = torch.nn.Parameter.__deepcopy__
    original_tensor = torch.Tensor.__deepcopy__
    function_copier = copy._deepcopy_dispatch[types.FunctionType]  # type: ignore[attr-defined]
    copy._deepcopy_dispatch[types.FunctionType] = _deepcopy_function  # type: ignore[attr-defined]
    torch.nn.Parameter.__deepcopy__ = _deepcopy_parameter  # type: ignore[method-assign]
    torch.Tensor.__deepcopy__ = _deepcopy_tensor_of_a_graph(original_tensor)  # type: ignore[method-assign]
    torch.nn.Module.__deepcopy__ = _deepcopy_module  # type: ignore[attr-defined]
    torch.optim.Optimizer.__deepcopy__ = _deepcopy_optimizer  # type: ignore[attr-defined]
    GRAD_SCALER.__deepcopy__ = deepcopy_grad_scaler  # type: ignore[attr-defined]
    try:
        yield
    finally:
        copy._deepcopy_dispatch[types.FunctionType] = function_copier  # type: ignore[attr-defined]
        torch.nn.Parameter.__deepcopy__ = original  # type: ignore[method-assign]
        torch.Tensor.__deepcopy__ = original_tensor  # type: ignore[method-assign]
        for owner, copier in (
            (torch.nn.Module, module_copier),
            (torch.optim.Optimizer, optimizer_copier),
            (GRAD_SCALER, scaler_copier),
        ):
            if copier is None:
                del owner.__deepcopy__  # type: ignore[attr-defined]
            else:
                owner.__deepcopy__ = copier  # type: ignore[attr-defined]


def _deepcopy_tensor_of_a_graph(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.__deepcopy__`` that also copies a tensor an autograd graph computed (``loss``).

    PyTorch's refuses such a tensor, which then stayed shared between the runs, and the reference's
    backward through it reached the notebook's own parameters. Its copy has its values and no graph,
    and says so if a backward pass reaches it (:func:`guard_graph_left_behind`).
    """

    def __deepcopy__(self: torch.Tensor, memo: dict[int, Any]) -> torch.Tensor:  # noqa: N807
        if self.grad_fn is None or type(self) is not torch.Tensor:
            known = id(self) in memo
            result = _pytorchs_deepcopy(self, memo, original)
            if not known and result is not self:
                add_leaf_hooks(result, _deepcopy(leaf_hooks(self), memo))
            left_behind = vars(self).get(GRAPH_LEFT_BEHIND_ATTR)
            if left_behind is not None and result.requires_grad:  # a copy's copy: hooks stay
                guard_graph_left_behind(result, left_behind)
            return result
        if id(self) in memo:
            return memo[id(self)]
        data = self.detach()  # a leaf on the same storage: its copy keeps views as views
        memo.setdefault(id(memo), []).append(data)  # alive with the memo (its id is a key)
        result = _pytorchs_deepcopy(data, memo, original).requires_grad_(True)
        guard_graph_left_behind(result, type(self.grad_fn).__name__)
        memo[id(self)] = result
        return result

    return __deepcopy__


def _pytorchs_deepcopy(
    tensor: torch.Tensor, memo: dict[int, Any], original: Callable[..., Any]
) -> torch.Tensor:
    """``original(tensor, memo)``: PyTorch's ``Tensor.__deepcopy__``, its steps taken here if plain.

    For a plain CPU tensor (:func:`_copied_by_storage`), the same steps as PyTorch's: a copy of its
    storage, one per storage through the memo's ``"torch"`` entry so views stay views; an empty
    tensor set to it; ``requires_grad``; the gradient's copy; the attribute dict's copy. Without
    its generic detours (a ``TypedStorage``, a ``copy.deepcopy`` of the storage, a ``no_grad``
    block, checks for sparse, quantized and subclass tensors), and in one clone for a tensor that
    is its whole storage: a run copies a hundred tensors per cell of a small GPT.
    """
    if not _copied_by_storage(tensor):
        with inference_mode_for(tensor):
            return original(tensor, memo)
    if id(tensor) in memo:
        return memo[id(tensor)]
    storage = tensor.untyped_storage()
    storage_copies = memo.setdefault("torch", {})  # PyTorch's own key: its copies of storages
    copied = storage_copies.get(storage._cdata)
    result = None
    with inference_mode_for(tensor):
        if copied is None and _whole_storage(tensor, storage):
            # its clone is a copy of its storage too, viewed as it is: one op instead of four
            result = (tensor.detach() if tensor.requires_grad else tensor).clone()
            if result.stride() == tensor.stride():
                copied = storage_copies[storage._cdata] = result.untyped_storage()
            else:  # (a dense clone keeps its strides: never, but then as PyTorch does)
                result = None
        if result is None:
            if copied is None:
                copied = storage_copies[storage._cdata] = storage.clone()
            result = tensor.new_empty([])
            result.set_(copied, tensor.storage_offset(), tensor.size(), tensor.stride())
        if tensor.requires_grad:
            result.requires_grad_()
    grad = tensor.grad
    if grad is not None:
        result.grad = grad.__deepcopy__(memo)
    result.__dict__ = _deepcopy(vars(tensor), memo)  # empty, as PyTorch copies it
    memo[id(tensor)] = result
    return result


def inference_mode_for(tensor: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """``torch.inference_mode()`` where ``tensor`` is an inference tensor, else nothing.

    A copy or a move of an inference tensor (``feats`` an earlier cell computed under
    ``torch.inference_mode()``) must be one too, or a backward pass through a run's copy works
    where it fails on a GPU ("Inference tensors cannot be saved for backward"). Tensors made
    there are inference tensors, and only there may one be set to a storage or require grad.

    Parameters
    ----------
    tensor : torch.Tensor
        The tensor about to be copied or moved.

    Returns
    -------
    contextlib.AbstractContextManager
        The context to make its copy in.
    """
    return torch.inference_mode() if tensor.is_inference() else contextlib.nullcontext()


def _whole_storage(tensor: torch.Tensor, storage: torch.UntypedStorage) -> bool:
    """Whether ``tensor`` is all of ``storage``, in its order (a weight, an optimizer state)."""
    return (
        tensor.storage_offset() == 0
        and tensor.is_contiguous()
        and tensor.nbytes == storage.nbytes()
    )


def _copied_by_storage(tensor: torch.Tensor) -> bool:
    """Whether PyTorch's ``Tensor.__deepcopy__`` of ``tensor`` is the plain copy of its storage.

    A plain strided CPU leaf with no attributes and no ``__torch_function__`` in the way (no
    subclass, no mode); not a quantized, nested, conjugated or negated view one.
    """
    return (
        type(tensor) is torch.Tensor
        and tensor.is_cpu
        and tensor.layout == torch.strided
        and tensor.grad_fn is None
        and not (tensor.is_quantized or tensor.is_nested or tensor.is_conj() or tensor.is_neg())
        and not vars(tensor)
        and not torch._C._has_torch_function_unary(tensor)
    )


#: Attribute of a tensor guarded by :func:`guard_graph_left_behind`: the ``grad_fn`` it was computed
#: by (copies and moves of it are guarded again; hooks do not come with them).
GRAPH_LEFT_BEHIND_ATTR = "_workbench_graph_left_behind"


def guard_graph_left_behind(tensor: torch.Tensor, grad_fn: str) -> None:
    """Make a backward pass that reaches ``tensor`` fail with a line saying why.

    ``tensor`` is a run's copy of one an earlier cell computed (its ``grad_fn``): the copy has no
    graph, so gradients through it cannot reach that cell's parameters (on a GPU they would), and an
    optimizer step after it would change nothing.
    """
    tensor.__dict__[GRAPH_LEFT_BEHIND_ATTR] = grad_fn

    def graph_left_behind(grad: torch.Tensor) -> None:
        raise RuntimeError(
            f"backward() reached a tensor an earlier cell computed ({grad_fn}); a run gets a copy "
            "of it without its autograd graph, so the gradients cannot reach that cell's "
            "parameters: compute it in this cell (run the forward pass here too), or .detach() it "
            "if its graph is not needed"
        )

    tensor.register_hook(graph_left_behind)


#: The device copy of each host storage a run's moves took there, by the storage's ``_cdata``,
#: with that storage itself: held, its address (the key) cannot be reused by another storage while
#: the moves go on. A parameter's host storage is freed as soon as the parameter moves, and a
#: device storage made next at that address (a tied weight met again in ``Module._apply``) then
#: found the first one's device copy: the weight read another tensor's memory on the target.
StorageMoves = dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]]


def move_to_device(
    value: Any,
    device: torch.device,
    force: bool = False,
    memo: StorageMoves | None = None,
    seen: dict[int, Any] | None = None,
) -> Any:
    """Move the tensors in ``value`` that live on an accelerator (or all, with ``force``) to ``device``.

    Modules move in place (``Module.to``), keeping parameter identity so optimizers stay attached,
    and so does a leaf tensor (its ``.data`` and ``.grad``: a tensor optimised alone keeps its
    optimizer); a computed tensor becomes a moved copy. Optimizer state tensors move too (except
    the ``step`` counters PyTorch keeps on the host), with ``force`` or when their parameter is on
    ``device`` already; lists, tuples and dicts are rebuilt around
    moved elements. CPU tensors stay on the CPU unless ``force``:
    in CUDA code a CPU tensor is there on purpose. Tensors that share a storage share one device
    storage afterwards (views keep their base), across every call given the same ``memo``. The
    attributes of notebook objects and what notebook closures and bound methods hold move in place;
    ``seen`` maps the containers and objects gone through to what they became (a graph with
    cycles: a trainer's callbacks holding the trainer; a tuple reached twice). A ``state_dict()``'s
    tensor viewing memory an earlier move with the same ``memo`` moved is moved too. A tensor a
    notebook object holds moves when the cell had put it on the device (:func:`mark_attribute_tensors`),
    not because the object did.
    """
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        # part of memory a move with the same memo took there (`head = x[:2]` in a plain cell
        # after x went to cuda) is on the device too: left here, what the cell did through it
        # missed x on the device. (All of it may be a copy on a GPU that the host standing in
        # for cuda did not make: `w0 = weight.detach().cpu()`.)
        follows = _storage_moved(value, memo) and not _whole_storage(value, value.untyped_storage())
        if (force or follows or on_accelerator(value)) and value.device != device:
            return _moved_tensor(value, device, memo)
        return value
    if isinstance(value, torch.nn.Module):
        tensors = list(value.parameters()) + list(value.buffers())
        if any((force or t.device.type != "cpu") and t.device != device for t in tensors):
            # Module.to's own walk, through the memo: a tensor sharing a parameter's storage (a
            # state_dict() the notebook keeps, a tied weight elsewhere) shares the moved one
            value._apply(lambda t: _module_tensor_moved(t, device, memo))
        if isinstance(value, SCRIPT_MODULES):
            # a frozen module's weights are constants of its code, not parameters: they move in
            # place as Module.to moves a parameter
            for constant in script_constants(value):
                if (force or on_accelerator(constant)) and constant.device != device:
                    constant.data = _device_view(constant.detach(), device, memo)
        # Module.to leaves the tensors its class keeps as plain attributes (a KV cache): they move
        # where the cell had put them (mark_attribute_tensors)
        for module in _modules_of(value):
            attributes = vars(module)
            for key, item in list(module_attributes(module)):
                if holds_tensors(item):
                    attributes[key] = move_to_device(item, device, False, memo, seen)
        return value
    if type(value) is EXPORTED_PROGRAM:  # a new program, its graph's devices moved too
        if force or any(on_accelerator(tensor) for tensor in program_tensors(value)):
            return program_moved(value, device)
        return value
    if isinstance(value, torch.optim.Optimizer):
        for param, state in value.state.items():
            # state follows its parameter: Adam's exp_avg is made where the parameter is, also by
            # a step a plain cell took (after the model moved, this optimizer's state moves too)
            follows = force or (isinstance(param, torch.Tensor) and param.device == device)
            for key, item in list(state.items()):
                if key != "step" and isinstance(item, torch.Tensor):
                    state[key] = move_to_device(item, device, follows, memo)
        return value
    if type(value) in _ATOMS:
        return value
    seen = {} if seen is None else seen
    if id(value) in seen:
        return seen[id(value)]
    seen[id(value)] = value  # what a cycle back to it finds while it is being moved

    def moved(item: Any, force: bool = force) -> Any:
        return move_to_device(item, device, force, memo, seen)

    if isinstance(value, list):
        value[:] = [moved(v) for v in value]
        return value
    if isinstance(value, collections.deque):
        items = [moved(v) for v in value]
        value.clear()
        value.extend(items)
        return value
    if isinstance(value, tuple):
        items = [moved(v) for v in value]
        if not all(m is v for m, v in zip(items, value, strict=True)):
            rebuilt = type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
            seen[id(value)] = rebuilt
            return rebuilt
        return value
    if isinstance(value, dict):
        # A module's state_dict() views its parameters' memory: where the module moved, so do its
        # tensors (another CPU tensor sharing that memory, `w0 = weight.detach().cpu()` on the
        # host standing in for cuda, is a copy on a GPU and stays)
        views = isinstance(value, collections.OrderedDict) and hasattr(value, "_metadata")
        for key in list(value):
            item = value[key]
            follows = views and isinstance(item, torch.Tensor) and _storage_moved(item, memo)
            value[key] = moved(item, force or follows)
        return value
    # The run's own copies of objects that hold state (a trainer, a closure's model): in place.
    if attributes_are_state(value) and isinstance(getattr(value, "__dict__", None), dict):
        attributes = vars(value)
        for key in list(attributes):
            item = attributes[key]
            # its own tensors by where the cell had them (a counter kept on the host stays)
            attributes[key] = moved(item, force and not isinstance(item, torch.Tensor))
    elif type(value) is types.FunctionType and _closure_state(value):
        for cell in value.__closure__ or ():
            with contextlib.suppress(ValueError):
                cell.cell_contents = moved(cell.cell_contents)
    elif type(value) is types.MethodType:
        moved(value.__self__)
    return value


def _storage_moved(tensor: torch.Tensor, memo: StorageMoves) -> bool:
    """Whether ``tensor`` views memory already moved to the device (``model.state_dict()``'s).

    Memory on the device is there for every tensor viewing it, whatever the notebook knew of them.
    """
    if not memo or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        return False
    try:
        return tensor.untyped_storage()._cdata in memo
    except (RuntimeError, NotImplementedError):  # no storage (a subclass, a sparse tensor)
        return False


def _moved_tensor(tensor: torch.Tensor, device: torch.device, memo: StorageMoves) -> torch.Tensor:
    # A leaf moves in place, as Module.to moves a parameter: it stays a leaf (``.to`` would give it
    # a grad_fn), and what else holds it (an optimizer of a tensor optimised alone, a list) holds
    # the moved tensor, hooks and marks included.
    if tensor.is_inference():
        # a new inference tensor, its marks included: an inference tensor's own data cannot be set
        # to a device's, and it has no optimizer or hooks to keep
        moved = _device_view(tensor.detach(), device, memo)
        moved.__dict__.update(vars(tensor))
        return moved
    if tensor.is_leaf:
        grad = tensor.grad
        tensor.data = _device_view(tensor.detach(), device, memo)
        if grad is not None:
            tensor.grad = _device_view(grad.detach(), device, memo)
        return tensor
    return tensor.to(device)


def _module_tensor_moved(
    tensor: torch.Tensor, device: torch.device, memo: StorageMoves
) -> torch.Tensor:
    """What ``Module.to`` sets a module's parameter or buffer to (see :func:`_device_view`)."""
    if isinstance(tensor, _UNINITIALIZED):  # a lazy module's: no data, moved as Module.to does
        return tensor.to(device)
    return _device_view(tensor.detach(), device, memo)


def _device_view(data: torch.Tensor, device: torch.device, memo: StorageMoves) -> torch.Tensor:
    """``data.to(device)``, as a view of the one device copy of ``data``'s whole storage."""
    if data.is_inference():  # an inference tensor's move is one too, as on the device
        with torch.inference_mode():
            return _device_view_of(data, device, memo)
    return _device_view_of(data, device, memo)  # (nearly every one: no context to enter)


def _device_view_of(data: torch.Tensor, device: torch.device, memo: StorageMoves) -> torch.Tensor:
    if type(data) is not torch.Tensor or data.layout != torch.strided:
        return data.to(device)
    if data.is_conj() or data.is_neg():  # lazy bits a storage view cannot carry
        return data.to(device)
    try:
        source = data.untyped_storage()
        key = source._cdata
        entry = memo.get(key)
        if entry is not None:
            storage = entry[1]
        elif (
            data.storage_offset() == 0
            and data.is_contiguous()
            and data.numel() * data.element_size() == source.nbytes()
        ):
            # The tensor is its whole storage (a weight, an optimizer state): its own copy is
            # the storage's device copy, in one op instead of five (a worker moves every
            # tensor a cell reads).
            moved = data.to(device)
            storage = moved.untyped_storage()
            memo[key] = (source, storage)
            if moved.stride() == data.stride():
                return moved
            # (size-1 dims may restride: the same bytes, viewed as before, below)
        else:
            whole = torch.empty(0, dtype=torch.uint8, device=data.device).set_(source)
            storage = whole.to(device).untyped_storage()
            memo[key] = (source, storage)
        view = torch.empty(0, dtype=data.dtype, device=device)
        return view.set_(storage, data.storage_offset(), data.shape, data.stride())
    except Exception:  # a device without storage views (or set_): a plain copy
        return data.to(device)


def mark_attribute_tensors(kept: Any, other: Any, depth: int = 0) -> None:
    """Mark the tensors objects in ``kept`` hold where ``other``'s are on a device.

    ``kept`` and ``other`` are one name's values after the two runs of a cell. A run on the host
    holds every tensor on the CPU: the accelerator run's placement of the same attribute says which
    ones the cell put on cuda, for the next cell's runs (:func:`move_to_device`). The objects are
    those whose attributes are state (:func:`attributes_are_state`: notebook objects, namespaces,
    a library's tensor holders), also where dicts, lists and tuples hold them (the layers of a
    ``DynamicCache``), walked side by side.
    """
    if depth > 8 or not _one_class(kept, other):
        return
    if not attributes_are_state(kept) and isinstance(kept, dict | list | tuple):
        # (a DynamicCache's list of layers, a dict of notebook objects: the objects inside; a
        # tensor a container holds moves with its container, as move_to_device moves it)
        if len(kept) != len(other) or len(kept) > _MOST_ITEMS_SEARCHED:
            return
        if isinstance(kept, dict):
            pairs: Iterable[tuple[Any, Any]] = ((v, other.get(k)) for k, v in kept.items())
        else:
            pairs = zip(kept, other, strict=True)
        for item, counterpart in pairs:
            if not isinstance(item, _NO_DEVICE_INSIDE):
                mark_attribute_tensors(item, counterpart, depth + 1)
        return
    if not attributes_are_state(kept):
        return
    mine, theirs = getattr(kept, "__dict__", None), getattr(other, "__dict__", None)
    if not (isinstance(mine, dict) and isinstance(theirs, dict)):
        return
    for key, item in mine.items():
        counterpart = theirs.get(key)
        if isinstance(item, torch.Tensor) and isinstance(counterpart, torch.Tensor):
            if on_accelerator(counterpart) and not on_accelerator(item):
                mark_on_accelerator(item)
        elif item is not kept:
            mark_attribute_tensors(item, counterpart, depth + 1)


def _one_class(kept: Any, other: Any) -> bool:
    """Whether one name's values after the two runs of a cell are of one class.

    A class the cell itself defines is two classes then: the kernel's run made one, and the
    worker's answer brings back the target's, rebuilt by value under the same name.
    """
    mine, theirs = type(kept), type(other)
    return mine is theirs or (
        mine.__qualname__ == theirs.__qualname__ and mine.__module__ == theirs.__module__
    )


def devices_on_the_device(kept: Any, other: Any, depth: int = 0) -> Iterator[torch.device]:
    """The CPU device objects inside ``kept`` that stand where ``other`` holds an accelerator's.

    ``kept`` and ``other`` are one name's values after the two runs of a cell, walked side by side
    through dicts, lists, tuples and the attributes of notebook objects (``cfg["device"]``,
    ``trainer.device``): the host standing in for cuda holds the cell's cuda device as a cpu one.
    """
    if depth > 8:
        return
    if type(kept) is torch.device:
        if kept.type == "cpu" and type(other) is torch.device and other.type not in _NOT_DEVICES:
            yield kept
        return
    if isinstance(kept, dict) and isinstance(other, dict):
        pairs: Iterable[tuple[Any, Any]] = ((v, other.get(k)) for k, v in kept.items())
    elif isinstance(kept, list | tuple) and isinstance(other, list | tuple):
        if len(kept) != len(other) or (kept and isinstance(kept[0], _PLAIN_DATA)):
            return  # (a list of numbers or strings is data: no device in it, and no walk over it)
        pairs = zip(kept, other, strict=False)
    elif attributes_are_state(kept) and _one_class(kept, other):
        mine, theirs = getattr(kept, "__dict__", None), getattr(other, "__dict__", None)
        if not (isinstance(mine, dict) and isinstance(theirs, dict)):
            return
        pairs = ((v, theirs.get(k)) for k, v in mine.items() if v is not kept)
    else:
        return
    for index, (item, counterpart) in enumerate(pairs):
        if index >= _MOST_ITEMS_SEARCHED:  # a dataset, not a setting
            return
        if item is not None and not isinstance(item, _PLAIN_DATA):
            yield from devices_on_the_device(item, counterpart, depth + 1)


_NOT_DEVICES = ("cpu", "meta")
#: Containers with more items than this are not looked into for devices (datasets, not settings).
_MOST_ITEMS_SEARCHED = 10_000
_PLAIN_DATA = (int, float, complex, str, bytes, bool, torch.Tensor)
_NO_DEVICE_INSIDE = (*_PLAIN_DATA, type(None), type)
#: What the transport rebuilds a device of an accelerator this process lacks as.
UNUSABLE_DEVICE_TYPE = "privateuseone"


def unusable_device(device: torch.device) -> bool:
    """Whether ``device`` is one this process lacks: another accelerator's, or cuda without a GPU.

    (A nested cuda device the notebook held as its host's stand-in travels to a worker as cuda.)
    """
    return device.type == UNUSABLE_DEVICE_TYPE or (
        device.type == "cuda" and not torch.cuda.is_available()
    )


def devices_replaced(
    value: Any,
    stand_in: Callable[[torch.device], torch.device],
    seen: set[int] | None = None,
    depth: int = 0,
) -> Any:
    """``value`` with the unusable devices inside it replaced in place (a tuple with them: anew).

    The one-sided twin of :func:`devices_on_the_device`: dicts, lists, tuples and any object's own
    attributes, each device this process lacks (:func:`unusable_device`) made ``stand_in(device)``.
    """
    if type(value) is torch.device:
        return stand_in(value) if unusable_device(value) else value
    seen = set() if seen is None else seen
    if depth > 16 or isinstance(value, _NO_DEVICE_INSIDE) or id(value) in seen:
        return value
    seen.add(id(value))

    def inner(item: Any) -> Any:
        return devices_replaced(item, stand_in, seen, depth + 1)

    if isinstance(value, dict | list):
        if len(value) <= _MOST_ITEMS_SEARCHED:
            keys = list(value) if isinstance(value, dict) else range(len(value))
            for key in keys:
                item = value[key]
                replaced = inner(item)
                if replaced is not item:
                    value[key] = replaced
    elif isinstance(value, tuple):
        if len(value) <= _MOST_ITEMS_SEARCHED:
            items = [inner(item) for item in value]
            if any(a is not b for a, b in zip(items, value, strict=True)):
                with contextlib.suppress(Exception):  # a tuple subclass made some other way
                    made = getattr(type(value), "_make", None)  # a namedtuple
                    return made(items) if made is not None else type(value)(items)
    elif not isinstance(value, types.ModuleType | types.FunctionType | types.MethodType):
        attributes = getattr(value, "__dict__", None)
        if type(attributes) is dict:  # an object's own (a module's, a notebook object's)
            for key, item in list(attributes.items()):
                replaced = inner(item)
                if replaced is not item:
                    attributes[key] = replaced
    return value


def mark_mixed_items(kept: Any, other: Any) -> bool:
    """Mark the tensors of a list, tuple or dict that the other run held on its device only.

    ``results = {"logits": model(x), "n": torch.ones(3)}``: a container holding device and CPU
    tensors side by side. Remembered as a whole, the next cell moved its CPU tensors to the device
    too (a GPU keeps them on the CPU); marked item by item, only those move. Returns whether
    ``kept`` was such a container (then marked).
    """
    if type(kept) not in (list, tuple, dict) or type(other) is not type(kept):
        return False
    if len(kept) != len(other) or len(kept) > _MOST_ITEMS_SEARCHED:
        return False
    if isinstance(kept, dict):
        pairs = [(v, other.get(k)) for k, v in kept.items()]
    else:
        pairs = list(zip(kept, other, strict=True))
    there = [
        on_accelerator(theirs)
        for mine, theirs in pairs
        if isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)
    ]
    if not any(there) or all(there):
        return False
    for mine, theirs in pairs:
        if isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor):
            if on_accelerator(theirs) and not on_accelerator(mine):
                mark_on_accelerator(mine)
    return True


def mixed_on_device(value: Any) -> bool:
    """Whether the list, tuple or dict ``value`` holds tensors on the device and off it.

    (:func:`mark_mixed_items`: its marked tensors move, not the whole container.)
    """
    if type(value) not in (list, tuple, dict):
        return False
    items = value.values() if isinstance(value, dict) else value
    there = [on_accelerator(t) for t in items if isinstance(t, torch.Tensor)]
    return any(there) and not all(there)


def mark_on_accelerator(tensor: torch.Tensor) -> None:
    """Mark ``tensor`` as one the cell had on its device (a CPU tensor standing for a cuda one).

    What :func:`on_accelerator` reads, as a worker's answer marks its device tensors: the next
    ``%%neuron`` cell puts it on each run's device. A tensor that takes no attributes stays as it is.
    """
    with contextlib.suppress(AttributeError, TypeError):
        vars(tensor)[ORIGIN_ATTR] = "cuda"


def on_accelerator(tensor: torch.Tensor) -> bool:
    """Whether the cell had put ``tensor`` on a device (it is there, or a worker sent it back)."""
    return tensor.device.type != "cpu" or ORIGIN_ATTR in getattr(tensor, "__dict__", ())


def tensors_in(value: Any, depth: int = 0, seen: set[int] | None = None) -> Iterable[torch.Tensor]:
    """Tensors directly reachable from ``value`` (bounded depth).

    Through modules, optimizers, containers, the attributes of notebook objects and dataclasses
    (``trainer.model``), and what notebook closures, bound methods and partials hold.
    """
    if depth > 8:
        return
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, torch.nn.Module):
        # (not its plain tensor attributes: Module.to leaves them where they are, so they tell
        # nothing of where the cell put the module)
        yield from value.parameters()
        yield from value.buffers()
        if isinstance(value, SCRIPT_MODULES):  # a frozen module's weights (torch.jit.freeze)
            yield from script_constants(value)
    elif isinstance(value, torch.optim.Optimizer):
        for state in value.state.values():
            yield from (v for k, v in state.items() if k != "step" and isinstance(v, torch.Tensor))
    elif type(value) is EXPORTED_PROGRAM:
        yield from program_tensors(value)
    elif type(value) in _ATOMS:
        return
    else:
        seen = set() if seen is None else seen
        if id(value) in seen:  # an object graph with cycles (obj.parent.child is obj)
            return
        seen.add(id(value))
        items = _contents(value)
        for item in held_values(value) if items is None else items:
            yield from tensors_in(item, depth + 1, seen)


def _contents(value: Any) -> Iterable[Any] | None:
    """What a container, a notebook object or a namespace holds (None: ``value`` is none of them)."""
    if isinstance(value, list | tuple | set | frozenset | collections.deque):
        return value
    if isinstance(value, dict):
        return value.values()
    if attributes_are_state(value):
        return list(vars(value).values()) if hasattr(value, "__dict__") else []
    return None


#: Elements looked at per notebook value when finding what shares state with the cell's values (a
#: dataset held as a list of tensors is passed over beyond this: sharing through it goes unseen).
SHARING_WALK_LIMIT = 10_000
#: How deep containers and object attributes are followed (modules and optimizers: all of them).
_SHARING_DEPTH = 4


#: IPython's input history (``_i``, ``_ii``, ``_iii``, ``_i7``): no cell binds these as its own,
#: where a user's ``_init`` or ``_idx`` is the cell's like any other name.
INPUT_HISTORY = r"_i{1,3}|_i\d+"
#: IPython's output and input history (``_``, ``__``, ``___``, ``_7``, ``_i7``, ``_oh``), also where
#: ``hidden`` does not list them, and the ``__`` names of Python and torch.compile (``__name__``,
#: ``__builtins_dict___0``). A user's own ``_model = model`` or ``_w = model.weight`` shares state
#: like any other name.
_IPYTHON_HISTORY = re.compile(rf"_|_\d+|{INPUT_HISTORY}|_[oid]h|__.*")


def with_names_sharing_state(
    names: Iterable[str], namespace: Mapping[str, Any], hidden: Collection[str] = ()
) -> set[str]:
    """``names`` and every other notebook name whose value is one of theirs or shares tensor memory.

    A cell that reads ``model`` only (``model.cuda()``, a backward pass) changes what ``optimizer``
    holds too, and one that steps ``optimizer`` changes ``model``; ``b = a`` and views of ``a`` see
    what is done to ``a``, as ``log = history`` sees what is appended to ``history``. Each run
    copies such names together with the ones the cell reads, so the copies keep sharing, and the
    kept run commits them together: a name the cell did not read never keeps the state from before
    the cell while its partner moves on. Tensors are found through modules (parameters, buffers,
    gradients), optimizers (parameters and state), containers and object attributes, a few levels
    down (:func:`_state_tensors`); other objects shared inside two values are not looked for.
    ``hidden`` names, IPython's history and the workbench's own results are never added.
    """
    found = set(names)
    keys: set[int | tuple[str, int]] = set()
    for name in found:
        if name in namespace:
            keys |= _sharing_keys(namespace[name])
    if not keys:
        return found
    others = {
        name: value
        for name, value in namespace.items()
        if name not in found
        and name not in hidden
        and not _IPYTHON_HISTORY.fullmatch(name)
        and needs_copy(value)
        and not _ours(value)
    }
    candidates = {name: _sharing_keys(value) for name, value in others.items()}
    grown = True
    while grown:  # a name sharing with an added name shares with the cell's values too
        grown = False
        for name, their_keys in list(candidates.items()):
            if their_keys & keys:
                found.add(name)
                keys |= their_keys
                del candidates[name]
                grown = True
    return found


@contextlib.contextmanager
def class_attributes_kept(namespace: Mapping[str, Any]) -> Iterator[None]:
    """Put the attributes of the notebook's classes back as they were once the body ends.

    A class is no copy in a run: ``Counter.n += 1`` in a run that is not kept (the float64
    oracle's rerun in the kernel, an in-process target) changed the notebook's class again, so a
    cell counted twice what a plain cell counts once. Rebinding is undone; what a run changes
    inside an attribute's value (``Counter.seen.append(x)``) is not.
    """
    saved = class_attributes(namespace)
    try:
        yield
    finally:
        put_back_class_attributes(saved)


def class_attributes(namespace: Mapping[str, Any]) -> list[tuple[type, dict[str, Any]]]:
    """The notebook's classes in ``namespace`` with their attributes as they are now.

    For :func:`put_back_class_attributes`: a shallow copy of each class's ``vars``.
    """
    return [
        (value, dict(vars(value)))
        for value in list(namespace.values())
        if isinstance(value, type) and value.__module__ == "__main__"
    ]


def put_back_class_attributes(saved: list[tuple[type, dict[str, Any]]]) -> None:
    """Bind the attributes :func:`class_attributes` saved again, and drop the ones added since.

    Rebinding is undone (``Counter.n += 1``, ``Counter.tag = "x"``); what changed inside an
    attribute's value (``Counter.seen.append(x)``) is not.
    """
    for cls, attributes in saved:
        current = vars(cls)
        for name in [name for name in current if name not in attributes]:
            with contextlib.suppress(AttributeError, TypeError):
                delattr(cls, name)
        for name, value in attributes.items():
            if current.get(name, _MISSING) is not value:
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(cls, name, value)


def _ours(value: Any) -> bool:
    """Whether ``value`` is a result of the workbench's (a report kept with ``-o``).

    It holds runs' outputs to show them, not state the notebook works with: copied along, every run
    it holds would be copied (and sent to the worker) with each cell, and kept, growing each time.
    """
    return type(value).__module__.startswith("neuron_workbench.")


def _sharing_keys(value: Any) -> set[int | tuple[str, int]]:
    """The object itself, and the state objects and tensor storages reachable from it.

    Objects by their ids, storages as ``("storage", address)``. Past the walk limit, what the walk
    found until then (breadth first: the shallowest).
    """
    keys: set[int | tuple[str, int]] = {id(value)} if needs_copy(value) else set()
    tensors: list[torch.Tensor] = []
    with contextlib.suppress(_WalkTooLong):  # past the limit: what was found until then
        tensors.extend(_state_tensors(value, keys))  # (the objects it meets: into the keys)
    for tensor in tensors:
        for each in (tensor, tensor.grad if tensor.is_leaf else None):
            if each is None or isinstance(each, _UNINITIALIZED) or each.layout != torch.strided:
                continue  # (a lazy module's parameter has no storage until its first call)
            try:
                keys.add(("storage", each.untyped_storage()._cdata))
            except (RuntimeError, NotImplementedError):  # a tensor without a storage of its own
                continue
    return keys


#: A lazy module's parameters and buffers before its first call (``nn.LazyLinear``).
_UNINITIALIZED = torch.nn.parameter.UninitializedTensorMixin


class _WalkTooLong(Exception):
    pass


def _state_tensors(value: Any, objects: set[Any] | None = None) -> Iterator[torch.Tensor]:
    """Tensors reachable from ``value``, for what shares state with what.

    Modules' parameters, buffers, hooks and other attributes (a recorder whose method is a forward
    hook, a logger the model holds), optimizers' parameters and state, and what containers, object
    attributes, closures, bound methods and partials hold (an LR scheduler's optimizer, a trainer's
    model) down to a few levels. The ids of the objects met on the way go into ``objects``.
    Raises :class:`_WalkTooLong` past :data:`SHARING_WALK_LIMIT` elements looked at (a tokenized
    corpus of plain ints counts each of them).
    """
    # breadth first: an object reached along several paths is seen at its shallowest depth
    # (item, depth, whether it was reached inside a library object: a logger's handler list is
    # that library's business, not state two notebook names share)
    todo: collections.deque[tuple[Any, int, bool]] = collections.deque([(value, 0, False)])
    seen: set[int] = set()
    looked_at = 0
    inside_library = False

    def follow(items: Iterable[Any], depth: int, counted: bool = True) -> None:
        nonlocal looked_at
        for each in items:
            if counted:
                looked_at += 1
                if looked_at > SHARING_WALK_LIMIT:
                    raise _WalkTooLong
            if type(each) not in _ATOMS:
                todo.append((each, depth, inside_library))

    while todo:
        item, depth, inside_library = todo.popleft()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            yield item
            hooks = leaf_hooks(item)  # a gradient recorder's list, held by its hook's closure
            if hooks is not None:
                for each in hooks:
                    if each is not None:
                        follow(each.values(), depth, counted=False)
                        if objects is not None:
                            objects.add(id(each))  # what a handle to one of them removes from
            continue
        if isinstance(item, RemovableHandle):  # shares state with the hooks' owner
            if objects is not None:
                for ref in (item.hooks_dict_ref, *item.extra_dict_ref):
                    hooks = ref()
                    if hooks is not None:
                        objects.add(id(hooks))
            continue
        if objects is not None and not inside_library and _holds_state(item):
            objects.add(id(item))
        if isinstance(item, torch.nn.Module):
            # its tensors count towards the limit, as before; its structure (submodules, hooks,
            # attributes) is the model's own size, not a dataset's
            # (its depth is its holder's: only data structures nest towards the depth limit)
            for key, attribute in vars(item).items():
                if objects is not None and key in _HOOK_DICTS:
                    # the dicts its hooks are kept in: a handle to one of them removes from it
                    objects.add(id(attribute))
                if key in _MODULE_TENSORS:
                    follow(attribute.values(), depth)
                elif key in _MODULE_STATE:
                    if attribute:  # (most hook dicts are empty)
                        follow(attribute.values(), depth, counted=False)
                elif (
                    not key.startswith("_")
                    and key != "training"
                    and type(attribute) not in _ATOMS  # as follow() passes over them
                ):
                    todo.append((attribute, depth, inside_library))
        elif isinstance(item, torch.optim.Optimizer):
            if objects is not None:  # its hooks' dicts, as a module's
                objects.update(id(v) for k, v in vars(item).items() if k in _HOOK_DICTS)
            for group in item.param_groups:
                follow((p for p in group.get("params", ()) if isinstance(p, torch.Tensor)), depth)
            for state in item.state.values():
                follow((v for v in state.values() if isinstance(v, torch.Tensor)), depth)
            for key in _OPTIMIZER_HOOKS:  # an EMA update registered as a step hook
                follow(vars(item).get(key, {}).values(), depth, counted=False)
        elif depth < _SHARING_DEPTH:
            if isinstance(item, list | tuple | set | frozenset):
                follow(item, depth + 1)
            elif isinstance(item, dict):
                follow(item.values(), depth + 1)
            elif type(item) in _CALLABLES_HOLDING_STATE:
                follow(held_values(item), depth + 1)
            elif needs_copy(item) and not _ours(item):
                inside_library = inside_library or (
                    type(item).__module__ != "__main__" and not _data_pipeline(item)
                )
                attributes = getattr(item, "__dict__", None)
                if isinstance(attributes, dict):
                    follow(attributes.values(), depth + 1)


#: Values the walk passes over: nothing a run can change in place, no tensor inside.
_ATOMS = frozenset(_IMMUTABLE)
#: What a module holds by name, each a dict of its values: its tensors, and the rest of its state.
_MODULE_TENSORS = frozenset({"_parameters", "_buffers"})
_MODULE_STATE = frozenset(
    {
        "_modules",
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_state_dict_hooks",
        "_load_state_dict_pre_hooks",
    }
)
_CALLABLES_HOLDING_STATE = (types.FunctionType, types.MethodType, functools.partial)
#: The dicts modules and optimizers keep their hooks in, by handle id.
_HOOK_DICTS = frozenset(
    {key for key in MODULE_INTERNALS if "hooks" in key and key != "_is_full_backward_hook"}
    | set(_OPTIMIZER_HOOKS)
)


def _holds_state(item: Any) -> bool:
    """Whether two names reaching ``item`` share state through it.

    Modules, optimizers, the data pipeline's loaders, datasets and samplers, mutable containers
    (a deque), random generators (torch's,
    ``random.Random``, NumPy's) and objects of notebook classes; not what is only shared as a
    constant (a class, a function, an enum member, a library's logger or config: a teacher and a
    student built from one config share no state through it). Nor a NumPy array: a dataset's arrays
    held in one dict would join every one of them (gigabytes copied with each cell) to a cell that
    reads one.
    """
    kind = type(item)
    return (
        _state_holder(item)
        or (kind.__module__ == "__main__" and not isinstance(item, type | enum.Enum))
        or (kind.__module__.startswith("numpy") and kind.__name__ in _NUMPY_STATE_HOLDERS)
    )


#: Library classes whose attributes are the notebook's own state: the dataset, sampler and
#: generator a loader was built with are the ones the notebook names (`sampler.set_epoch(epoch)`
#: must reach the loader's after a cell that read only the loader), as is a ``Subset``'s dataset.
_DATA_PIPELINE = (torch.utils.data.DataLoader, torch.utils.data.Dataset, torch.utils.data.Sampler)
_data_pipeline = _instance_check(_DATA_PIPELINE)
_STATE_HOLDERS = (
    torch.nn.Module,
    torch.optim.Optimizer,
    torch.Generator,
    list,
    dict,
    set,
    collections.deque,
    bytearray,
    random.Random,
    *_DATA_PIPELINE,
)
_state_holder = _instance_check(_STATE_HOLDERS)
_NUMPY_STATE_HOLDERS = frozenset({"Generator", "RandomState"})


def version_signature(value: Any, writes: UnversionedWrites | None = None) -> tuple[Any, ...]:
    """In-place-modification counters of the tensors in ``value``, and what its objects hold.

    PyTorch bumps ``Tensor._version`` on every in-place op, so a changed signature means the run
    mutated the object (an optimizer step, ``.backward()`` filling ``.grad``) without rebinding it.
    The writes of kernels that leave the counter alone (a fused optimizer's step) are added from
    ``writes``, the run's :class:`~neuron_workbench.run.unversioned_writes.UnversionedWrites`.
    Gradients count, an optimizer's learning rates too, and what lists, deques, dicts, sets,
    notebook objects, namespaces and modules hold, by identity: an append, an item or attribute set,
    a buffer, layer or parameter replaced. The objects walked are those of :func:`tensors_in`.
    """
    signature: list[Any] = []
    _sign(value, 0, set(), signature, writes)
    return tuple(signature)


def _sign(
    value: Any, depth: int, seen: set[int], out: list[Any], writes: UnversionedWrites | None
) -> None:
    if depth > 8:
        return
    if isinstance(value, torch.Tensor):
        grad = value.grad if value.is_leaf else None
        grad_sig = (0, -1) if grad is None else (id(grad), _version_of(grad, writes))
        # the dtype too: model.half() swaps each parameter's data, which bumps no counter (a
        # move alone, model.cuda(), changes no value and is no output)
        out.append((id(value), _version_of(value, writes), value.dtype, *grad_sig))
        return
    if type(value) in _ATOMS or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.nn.Module):
        for module in _modules_of(value):
            for key, item in vars(module).items():
                if key in MODULE_INTERNALS:
                    if key in _MODULE_TENSORS:
                        for tensor in item.values():
                            if tensor is not None:
                                _sign(tensor, depth, seen, out, writes)
                    elif key == "_modules":
                        out.append(tuple(map(id, item.values())))  # a layer replaced
                elif type(item) not in _ATOMS and holds_tensors(item):
                    # the class's own state (a KV cache); a setting the forward rewrites
                    # (self.last_shape) is no output, as the comparison does not read it
                    out.append(id(item))
                    _sign(item, depth + 1, seen, out, writes)
        return
    if isinstance(value, torch.optim.Optimizer):
        for group in value.param_groups:  # an LR scheduler's step changes no tensor ...
            lr = group.get("lr")
            if isinstance(lr, torch.Tensor):  # ... but a tensor learning rate, filled in place
                lr = (id(lr), _version_of(lr, writes))
            out.append((lr, tuple(map(id, group.get("params", ())))))
        for state in value.state.values():
            for key, item in state.items():
                if key != "step" and isinstance(item, torch.Tensor):
                    _sign(item, depth, seen, out, writes)
        return
    contents = _contents(value)
    if contents is None:  # a closure's, a bound method's object, a partial's: by their own
        for item in held_values(value):
            _sign(item, depth + 1, seen, out, writes)
        return
    items = list(contents)
    out.append(len(items))
    out.extend(map(id, items))
    for item in items:
        _sign(item, depth + 1, seen, out, writes)


def _version_of(tensor: torch.Tensor, writes: UnversionedWrites | None = None) -> int:
    # An inference tensor has no version counter: it changes in place only inside inference mode,
    # where a change is not seen (the run's copy is committed all the same)
    if isinstance(tensor, _UNINITIALIZED):  # a lazy module's, until its first call gives it data
        return -2
    if tensor.is_inference():
        return -1
    return tensor._version + (writes.count(tensor) if writes is not None else 0)


class _Held:
    """A strong entry of :class:`ResidentObjects`, for what cannot be weakly referenced."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value


def _references(held: _Held) -> int:
    return sys.getrefcount(held.value)


#: What :func:`_references` counts for a value that only its entry holds (measured, not assumed:
#: interpreters count the call's own references differently).
_SOLE_REFERENCES = _references(_Held(object()))


def _still_held(ref: Callable[[], Any]) -> bool:
    """Whether an entry's object is alive and, for a strong entry, held by more than the entry."""
    if type(ref) is _Held:
        return _references(ref) > _SOLE_REFERENCES
    return ref() is not None


class ResidentObjects:
    """Objects a ``%%neuron`` run left in the namespace that the cell had put on its (CUDA) device.

    When the reference backend is the CPU, a tensor the cell moved to "cuda" is a CPU tensor in the
    namespace afterwards; the next ``%%neuron`` cell must still see it on each run's device. Entries
    hold a weak reference where possible so a recycled ``id`` never matches a new object.
    """

    def __init__(self) -> None:
        self._entries: dict[int, Callable[[], Any]] = {}

    def add(self, value: Any) -> None:
        """Remember ``value`` as device-resident."""
        try:
            ref: Callable[[], Any] = weakref.ref(value)
        except TypeError:  # containers and devices cannot be weakly referenced: held until pruned
            ref = _Held(value)
        self._entries[id(value)] = ref

    def discard(self, value: Any) -> None:
        """Forget ``value`` (moved off the device); nothing happens if it was not remembered."""
        if value in self:
            del self._entries[id(value)]

    def on_device(self, value: Any) -> bool:
        """Whether an earlier cell left ``value`` on the device: remembered, or a tensor in it is."""
        return value in self or any(on_accelerator(t) for t in tensors_in(value))

    def __contains__(self, value: Any) -> bool:
        ref = self._entries.get(id(value))
        return ref is not None and ref() is value

    def devices(self) -> list[torch.device]:
        """The device objects remembered: what the cell built as its cuda device, wherever held."""
        found = (ref() for ref in self._entries.values())
        return [value for value in found if type(value) is torch.device]

    def prune(self) -> None:
        """Drop entries whose object is gone, or that nothing but this registry holds any more.

        A strongly held entry (a dict, list or device the cell bound) that the notebook rebound
        can never be looked up again; holding it kept its tensors alive for the whole session.
        """
        while True:  # a held container may be all that held another one: until none goes
            entries = self._entries  # (rebinding it frees the entries dropped last time round)
            kept = {key: ref for key, ref in entries.items() if _still_held(ref)}
            if len(kept) == len(entries):
                return
            self._entries = kept
