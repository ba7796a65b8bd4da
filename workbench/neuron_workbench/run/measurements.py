"""Where a cell's Python numbers came from: timers, memory statistics, device properties, tensors.

A cell that times itself or reads memory statistics binds numbers that differ between any two runs
by nature; they are *measurements*, to be shown side by side, never diffed. A Python number that
``loss.item()`` made from a float32 tensor carries float32 precision, not float64. Both facts are
known only where the number is made, so for the length of a run the sources hand out numbers that
remember it:

- timers (``time.perf_counter``, ``time``, ``monotonic``, ``process_time``, ``thread_time`` and their
  ``_ns`` forms), ``torch.cuda.Event.elapsed_time``, the profiler's times (its events'
  ``cpu_time_total`` and the others made from their intervals) and its table
  (``prof.key_averages().table(...)``, and ``str()`` of its event lists);
- ``torch.cuda`` memory statistics (``memory_allocated``, ``max_memory_allocated``,
  ``memory_reserved``, ``max_memory_reserved``, ``memory_stats``, ``mem_get_info``) and device
  properties (``get_device_properties``, ``get_device_name``, ``get_device_capability``);
- tensor to Python scalar conversions (``Tensor.item``, ``.tolist()`` of a tensor of at most
  :data:`SMALL_TOLIST` elements; ``float(t)`` and ``int(t)`` are seen but stay plain, as Python
  requires), all through :func:`scalar_from_tensor`, the one interception point, reached from the
  run's torch function mode (:func:`materialise`); issue 27 records the sequence of scalars there.
  A run on a real CUDA backend has no such mode (nothing is remapped): its scalars stay plain, and
  a comparison takes the dtype from the other run.

The numbers are :class:`TaggedFloat`, :class:`TaggedInt` and :class:`TaggedStr`: plain ``float``,
``int`` and ``str`` subclasses with a :class:`Provenance`. They behave as the plain values do
(``repr``, formatting, hashing, equality, JSON, use as torch arguments); arithmetic with plain
numbers or other tagged numbers keeps the provenance (``(t1 - t0) * 1e3``, ``mem / 2**20``,
``ms / steps``, ``running += loss.item()``), and so do lists and dicts that hold them. They pickle
by value with their provenance, so they come back from a worker process as they left. Nothing runs
per op beyond one lookup in the run's existing torch function mode: the timers and statistics are
replaced only while :func:`tracked` is active.

Summaries of a list of measurements are measurements too: ``statistics``' averages, medians and
spreads, ``math.fsum`` and NumPy's reductions (``np.mean(times)``, ``np.percentile(times, 90)``;
a NumPy ``float64`` result stays one, tagged). What loses the provenance: ``int(x)`` and
``float(x)`` of a tagged number (Python requires exact types there), tensors and pandas objects
built from tagged numbers. The run notes every float value it measured, so a plain float or a float
array holding only those (``float(np.median(times))``, a pandas column of timings, a float32
``torch.tensor(times)``) still compares as a measurement; an ``int(x)`` does not (a small integer
is found by chance among other outputs). A text made of a measurement (``f"took {ms:.1f} ms"``,
``str(dt)``, a profile's table in a longer text) is a plain ``str``, but the run notes the piece it
made (see :func:`tracked`), and the comparison takes two texts that differ only in such pieces as a
measurement; printf-style ``"%.3f" % dt`` formats without asking the number, so it is not seen. An
array of
measurements (``np.array(times)``, ``np.asarray(times)``) is a :class:`TaggedArray`, and so is what
NumPy computes from it (see :func:`_tagged_array_type`), and an array the cell preallocated
(``np.zeros(reps)``) once it stores a measurement (see :func:`_preallocated`).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import datetime
import functools
import itertools
import math
import operator
import sys
import time
import types
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

try:  # torch imports NumPy where it is installed; the workbench does not need it
    import numpy
except ImportError:  # pragma: no cover - a torch without NumPy
    numpy = None  # type: ignore[assignment]

from neuron_workbench.run.namespace import attributes_are_state
from neuron_workbench.run.patching import names_rebound, patched_attributes
from neuron_workbench.run.scalar_sites import user_site

__all__ = [
    "MEASUREMENT_KINDS",
    "SMALL_TOLIST",
    "Provenance",
    "TaggedFloat",
    "TaggedInt",
    "TaggedStr",
    "is_measurement",
    "observe_scalars",
    "provenance_of",
    "scalar_from_tensor",
    "source_dtype",
    "tag",
    "timers_named_in",
    "tracked",
]

#: Provenance kinds that make a value a measurement (shown, never diffed).
MEASUREMENT_KINDS = ("time", "memory", "device")
#: ``.tolist()`` of a tensor with at most this many elements gives tagged numbers.
SMALL_TOLIST = 1024


@dataclass(frozen=True)
class Provenance:
    """Where a Python value came from.

    Attributes
    ----------
    kind : str
        ``time``, ``memory`` or ``device`` (measurements: :data:`MEASUREMENT_KINDS`), or ``tensor``
        (a scalar materialised from a tensor).
    source : str
        The call that made it, e.g. ``time.perf_counter``, ``torch.cuda.max_memory_allocated``,
        ``Tensor.item``.
    unit : str or None
        ``s``, ``ms``, ``us``, ``ns``, ``B``, ``KiB``, ``MiB``, ``GiB``, ``KB``, ``MB``, ``GB`` where
        known (scaled by exact factors such as ``* 1e3`` or ``/ 2**20``); None otherwise.
    dtype : str or None
        For ``tensor``: the dtype of the tensor the value came from (``float32``).
    """

    kind: str
    source: str
    unit: str | None = None
    dtype: str | None = None

    @property
    def measurement(self) -> bool:
        """True for timers, memory statistics and device properties."""
        return self.kind in MEASUREMENT_KINDS


# ---- units -----------------------------------------------------------------------------------------

_UNIT_SIZES = {
    "time": {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9},
    "memory": {
        "B": 1.0,
        "KiB": 2.0**10,
        "MiB": 2.0**20,
        "GiB": 2.0**30,
        "KB": 1e3,
        "MB": 1e6,
        "GB": 1e9,
    },
}
_FAMILY = {unit: family for family, units in _UNIT_SIZES.items() for unit in units}


def _scaled(unit: str | None, factor: float) -> str | None:
    """The unit of ``value * factor`` for a value in ``unit`` (kept when no exact unit fits)."""
    family = _FAMILY.get(unit or "")
    if family is None:
        return unit
    size = _UNIT_SIZES[family][unit] / factor  # type: ignore[index]
    for name, other in _UNIT_SIZES[family].items():
        if math.isclose(size, other, rel_tol=1e-9):
            return name
    return unit  # ``ms / steps``: still milliseconds (per step)


# ---- tagged values -------------------------------------------------------------------------------

_NUMBER = (int, float)


def provenance_of(value: Any) -> Provenance | None:
    """The :class:`Provenance` of a tagged value, or None."""
    return getattr(value, "provenance", None) if isinstance(value, TAGGED) else None


def is_measurement(value: Any) -> bool:
    """Whether ``value`` came from a timer, a memory statistic or a device property."""
    prov = provenance_of(value)
    return prov is not None and prov.measurement


@dataclass
class MeasuredForms:
    """What a run made of its measurements that no longer carries their provenance.

    Attributes
    ----------
    texts : dict of str to (str, str)
        Texts made of a measurement (``f"{ms:.1f}"``, ``str(dt)``, a profile's table), to its
        ``(kind, source)``: a log line the cell builds from them differs between runs by nature.
    values : dict of float to (str, str)
        The float values of the run's measurements: a ``float(np.median(times))`` or a pandas
        column of timings holds them as plain numbers.
    """

    texts: dict[str, tuple[str, str]] = field(default_factory=dict)
    values: dict[float, tuple[str, str]] = field(default_factory=dict)


#: What each active run made of its measurements, the innermost run's last (see :func:`tracked`).
_MEASURED: list[MeasuredForms] = []

#: The most texts a run notes (a loop formatting a timing per step repeats few distinct ones).
MAX_MEASURED_TEXTS = 256
#: The most measured values a run notes (a timing loop's steps, a few each).
MAX_MEASURED_VALUES = 4096


def _noted(value: Any, text: str) -> str:
    """``text``, made from ``value``; noted as a measurement's text where ``value`` is one.

    A one-character text (``f"{gb:.0f}"``: ``0``) is not noted: found again in any other text,
    it would cover too much of it.
    """
    return _noted_as(getattr(value, "provenance", None), text)


def _noted_as(prov: Provenance | None, text: str) -> str:
    """``text``, noted as made of a measurement where ``prov`` is one's (see :func:`_noted`)."""
    if _MEASURED and prov is not None and prov.measurement and len(text) > 1:
        texts = _MEASURED[-1].texts
        if len(texts) < MAX_MEASURED_TEXTS:
            texts.setdefault(text, (prov.kind, prov.source))
    return text


def _noted_value(value: float, prov: Provenance | None) -> None:
    """Note a measurement's float ``value`` made during the run (see :class:`MeasuredForms`)."""
    if _MEASURED and prov is not None and prov.measurement:
        values = _MEASURED[-1].values
        if len(values) < MAX_MEASURED_VALUES and math.isfinite(value):
            values.setdefault(float(value), (prov.kind, prov.source))


def source_dtype(value: Any) -> torch.dtype | None:
    """The dtype of the tensor a Python scalar was materialised from, or None."""
    prov = provenance_of(value)
    if prov is None or prov.kind != "tensor" or prov.dtype is None:
        return None
    dtype = getattr(torch, prov.dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else None


def tag(value: Any, provenance: Provenance) -> Any:
    """``value`` with ``provenance``: numbers and strings tagged, lists/tuples/dicts item by item.

    Booleans cannot be subclassed and stay as they are, as does anything else.
    """
    kind = type(value)
    if kind is bool or value is None:
        return value
    if kind in TAGGED:  # (a summary of a tagged array NumPy computed through its methods)
        value = _plain(value)
        kind = type(value)
    numpy_tagged = _NUMPY_TAGGED.get(kind)
    if numpy_tagged is not None:  # a NumPy summary's (np.mean(times)): it stays NumPy's type
        return numpy_tagged(value, provenance)
    if numpy is not None and isinstance(value, numpy.ndarray) and value.dtype.kind in "biuf":
        return TaggedArray(value, provenance)  # np.array(times): an array of measurements
    if isinstance(value, float):
        return TaggedFloat(value, provenance)
    if isinstance(value, int):
        return TaggedInt(value, provenance)
    if isinstance(value, str):
        return TaggedStr(value, provenance)
    if kind is list:
        return [tag(item, provenance) for item in value]
    if kind is tuple:
        return tuple(tag(item, provenance) for item in value)
    if kind is dict:
        return {key: tag(item, provenance) for key, item in value.items()}
    return value


def _plain(value: Any) -> Any:
    if numpy is not None and isinstance(value, TaggedArray):
        return value.view(numpy.ndarray)
    numpy_type = _NUMPY_PLAIN.get(type(value))
    if numpy_type is not None:
        return numpy_type(value.item())
    if isinstance(value, TaggedFloat):
        return float.__float__(value)
    if isinstance(value, TaggedInt):
        return int.__int__(value)
    if isinstance(value, TaggedStr):
        return str.__str__(value)
    if isinstance(value, MeasuredDatetime):
        return _PLAIN_DATETIME(
            *value.timetuple()[:6], value.microsecond, value.tzinfo, fold=value.fold
        )
    if isinstance(value, MeasuredTimedelta):
        return _PLAIN_TIMEDELTA(
            value.days, _PLAIN_TIMEDELTA.seconds.__get__(value), value.microseconds
        )
    return value


def untagged(value: Any, depth: int = 0, seen: set[int] | None = None) -> Any:
    """``value`` with the tagged numbers and strings in it made plain, containers in place.

    What a kept run commits to the notebook: plain code holds a ``float`` from ``loss.item()``
    (``type(x) is float``, ``yaml.safe_dump``); the provenance served the run's comparison. Lists,
    dicts, deques and the attributes of notebook objects and namespaces change in place, a few
    levels deep; a tuple holding a tagged value is rebuilt.
    """
    if isinstance(value, TAGGED):
        return _plain(value)
    if depth > 4 or isinstance(value, (bool, int, float, str, bytes)) or value is None:
        return value
    seen = set() if seen is None else seen
    if id(value) in seen:
        return value
    seen.add(id(value))
    if isinstance(value, list):
        value[:] = [untagged(item, depth + 1, seen) for item in value]
    elif isinstance(value, collections.deque):
        items = [untagged(item, depth + 1, seen) for item in value]
        value.clear()
        value.extend(items)
    elif isinstance(value, dict):
        for key in list(value):
            value[key] = untagged(value[key], depth + 1, seen)
    elif type(value) is tuple:  # a namedtuple or a subclass keeps what it holds
        items = tuple(untagged(item, depth + 1, seen) for item in value)
        if any(a is not b for a, b in zip(items, value, strict=True)):
            return items
    elif attributes_are_state(value) and isinstance(getattr(value, "__dict__", None), dict):
        attributes = vars(value)
        for key in list(attributes):
            attributes[key] = untagged(attributes[key], depth + 1, seen)
    return value


def without_tags(value: Any, depth: int = 0) -> Any:
    """``value`` itself when it holds no tagged value, else a copy holding plain ones.

    What ``torch.save`` writes during a run: ``{"model": sd, "loss": loss.item()}`` as plain code
    writes it (a ``float``, which ``torch.load(weights_only=True)`` accepts). Dicts (a state dict's
    ``_metadata`` kept), lists and tuples are copied only where a tagged value is inside.
    """
    if isinstance(value, TAGGED):
        return _plain(value)
    if depth > 4:
        return value
    if isinstance(value, dict):
        items = {key: without_tags(item, depth + 1) for key, item in value.items()}
        if all(items[key] is value[key] for key in value):
            return value
        copied = copy.copy(value)
        copied.update(items)
        return copied
    if type(value) in (list, tuple):
        items_list = [without_tags(item, depth + 1) for item in value]
        if all(a is b for a, b in zip(items_list, value, strict=True)):
            return value
        return type(value)(items_list)
    return value


def _combined(
    a: Provenance | None, b: Provenance | None, name: str, other: Any, result: Any
) -> Provenance | None:
    """The provenance of ``self <name> other``, or None when the result has none.

    ``a`` is self's, ``b`` the other operand's (None for a plain number ``other``), ``result`` the
    plain result.
    """
    reflected = name in _REFLECTED
    name = name.removeprefix("r") if reflected else name
    if a is None or (b is not None and b.measurement and not a.measurement):
        a, b = b, a
    if a is None:
        return None
    if a.measurement:
        unit = a.unit
        if b is not None:  # two tagged operands: a unit survives only adding like to like
            unit = a.unit if name in ("add", "sub") and b.unit == a.unit else None
        elif name == "mul" and other:
            unit = _scaled(a.unit, float(other))
        elif name in ("truediv", "floordiv") and other and not reflected:
            unit = _scaled(a.unit, 1.0 / float(other))
        elif name in ("pow", "mod", "truediv", "floordiv"):
            unit = None  # ``n / seconds`` is a rate
        return a if unit == a.unit else replace(a, unit=unit)
    # Scalars from tensors: Python arithmetic with a plain number keeps the tensor's precision
    # (as a tensor op with a Python scalar would); two sources promote as tensors do.
    dtype = a.dtype
    if b is not None and b.dtype and dtype and b.dtype != dtype:
        promoted = torch.promote_types(getattr(torch, dtype), getattr(torch, b.dtype))
        dtype = str(promoted).removeprefix("torch.")
    torch_dtype = getattr(torch, dtype or "", None)
    if not isinstance(torch_dtype, torch.dtype):
        return None
    if isinstance(result, float) != torch_dtype.is_floating_point:
        return None  # ``int_item / 2`` or ``math.floor(loss)``: the tensor's dtype no longer says
    return a if dtype == a.dtype else replace(a, dtype=dtype)


def _binary(name: str) -> Callable[[Any, Any], Any]:
    reflected = name in _REFLECTED
    op = getattr(operator, name[1:] if reflected else name)

    def method(self: Any, other: Any, *modulo: Any) -> Any:
        if modulo:  # three-argument pow(): a plain result, as the builtin type gives it
            return pow(_plain(self), _plain(other), *modulo)
        if not isinstance(other, _NUMERIC):
            return NotImplemented  # a tensor, an array: their own operator decides
        a, b = _plain(self), _plain(other)
        result = op(b, a) if reflected else op(a, b)
        if type(result) is bool or not isinstance(result, _NUMERIC):
            return result
        prov = _combined(self.provenance, provenance_of(other), name, b, result)
        return result if prov is None else tag(result, prov)

    method.__name__ = f"__{name}__"
    return method


def _unary(func: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, *args: Any) -> Any:
        result = func(_plain(self), *args)
        if type(result) is bool or not isinstance(result, _NUMERIC):
            return result
        prov = _combined(self.provenance, None, "unary", None, result)
        return result if prov is None else tag(result, prov)

    return method


_BINARY = (
    "add",
    "radd",
    "sub",
    "rsub",
    "mul",
    "rmul",
    "truediv",
    "rtruediv",
    "floordiv",
    "rfloordiv",
    "mod",
    "rmod",
    "pow",
    "rpow",
)
_REFLECTED = frozenset(n for n in _BINARY if n.startswith("r"))
_UNARY = {
    "__neg__": operator.neg,
    "__pos__": operator.pos,
    "__abs__": abs,
    "__round__": round,
    "__floor__": math.floor,
    "__ceil__": math.ceil,
    "__trunc__": math.trunc,
}


def _rebuild(cls: type, value: Any, provenance: Provenance) -> Any:
    return cls(value, provenance)


def reduce_tagged(value: Any) -> tuple[Any, ...]:
    """How the workbench's own transport pickles a tagged value: with its provenance.

    Every other pickle (``torch.save`` of a checkpoint holding ``loss.item()``, ``pickle.dump``)
    gets the plain number or string: a file that needs this package to load, or that
    ``torch.load(weights_only=True)`` refuses, is no file the cell meant to write.
    """
    return _rebuild, (type(value), _plain(value), value.provenance)


class _TaggedNumber:
    """Arithmetic that keeps the provenance (mixed into the float and int subclasses)."""

    provenance: Provenance

    def __reduce__(self) -> Any:
        plain = _plain(self)
        return type(plain), (plain,)

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: Any) -> Any:
        return self

    def __format__(self, spec: str) -> str:
        # f"step took {ms:.1f} ms": the text is no tagged value, but the run notes it was made
        # from a measurement, so the comparison can tell a log line's timing from its other words
        return _noted(self, format(_plain(self), spec))


for _name in _BINARY:
    setattr(_TaggedNumber, f"__{_name}__", _binary(_name))
for _dunder, _func in _UNARY.items():
    setattr(_TaggedNumber, _dunder, _unary(_func))


class TaggedFloat(_TaggedNumber, float):
    """A ``float`` that remembers where it came from (see :class:`Provenance`)."""

    def __new__(cls, value: Any, provenance: Provenance | None = None) -> Any:  # noqa: D102
        if provenance is None:  # type(x)(value), as statistics.mean converts: a plain float
            return float(value)
        self = float.__new__(cls, value)
        self.provenance = provenance
        _noted_value(self, provenance)
        return self

    def __repr__(self) -> str:
        return _noted(self, float.__repr__(self))

    __str__ = __repr__  # ("elapsed " + str(dt), "%s" % dt, str([t0, t1]))
    __hash__ = float.__hash__


class TaggedInt(_TaggedNumber, int):
    """An ``int`` that remembers where it came from (see :class:`Provenance`)."""

    def __new__(cls, value: Any, provenance: Provenance | None = None) -> Any:  # noqa: D102
        if provenance is None:
            return int(value)
        self = int.__new__(cls, value)
        self.provenance = provenance
        return self

    def __repr__(self) -> str:
        return _noted(self, int.__repr__(self))

    __str__ = __repr__
    __hash__ = int.__hash__


class TaggedStr(str):
    """A ``str`` that remembers where it came from (a device name)."""

    def __new__(cls, value: Any, provenance: Provenance | None = None) -> Any:  # noqa: D102
        if provenance is None:
            return str(value)
        self = str.__new__(cls, value)
        self.provenance = provenance
        # a profile's table, wherever the cell puts it ("Profile:\n" + table, f"{table}")
        _noted(self, str.__str__(self))
        return self

    def __reduce__(self) -> Any:
        return str, (str.__str__(self),)


def _tagged_numpy_scalar(base: type) -> type:
    """A subclass of the NumPy scalar type ``base`` that remembers where it came from.

    NumPy's own methods make new scalars of the receiver's type, through ``__new__`` or without
    it: each is one of this type, with no provenance unless given one (a plain number, as the
    method gives on a plain one). :class:`_TaggedNumber`'s methods are copied in, not inherited:
    NumPy's scalar methods crash (``ms.round(2)``) on a subclass with another base before ``base``.
    """

    def __new__(cls: type, value: Any, provenance: Provenance | None = None) -> Any:
        # always an instance of cls: NumPy writes the value into what __new__ returns
        self = base.__new__(cls, value)  # type: ignore[call-overload]
        self.provenance = provenance
        if isinstance(self, numpy.floating):
            _noted_value(float(self.item()), provenance)
        return self

    def round(self: Any, decimals: int = 0, out: Any = None) -> Any:
        # np.mean(times).round(2), tagged as round(ms, 2) is
        result = _plain(self).round(decimals, out)
        return result if out is not None else tag(result, self.provenance)

    namespace: dict[str, Any] = {
        name: method
        for name, method in vars(_TaggedNumber).items()
        if name.startswith("__") and callable(method) and name != "__init_subclass__"
    }
    namespace.update(
        __new__=__new__,
        __repr__=base.__repr__,
        __str__=base.__str__,
        __hash__=base.__hash__,
        __module__=__name__,
        __doc__=f"A NumPy ``{base.__name__}`` that remembers where it came from "
        "(``np.mean(times)``).",
        provenance=None,
        round=round,
    )
    return type(f"Tagged{base.__name__.capitalize()}", (base,), namespace)


#: The ufuncs whose value is in the unit of their tagged operands (a difference of times is a time).
_UNIT_KEEPING_UFUNCS = frozenset(
    {"add", "subtract", "negative", "positive", "absolute", "maximum", "minimum", "fmax", "fmin"}
    | {"rint", "floor", "ceil", "trunc"}
)
#: ``ndarray`` methods that summarise it, and whether the value keeps the unit (see SUMMARIES).
_ARRAY_SUMMARIES = {
    **dict.fromkeys(("mean", "std", "min", "max", "sum", "ptp", "cumsum"), True),
    "var": False,
    "prod": False,
}


def _tagged_array_type() -> type:
    """A NumPy ``ndarray`` subclass that remembers where its values came from (``np.array(times)``).

    What NumPy computes from it keeps the provenance: element-wise arithmetic and comparisons
    (``arr * 1e3``, ``arr > 0.01``: an array, the unit kept where the ufunc keeps it and scaled by
    a number as a tagged float's), reductions and the summarising methods (``arr.mean()``, a
    tagged NumPy scalar), an element (``arr[0]``), iteration and ``tolist()``. One without a
    provenance is a plain array the cell preallocated (:func:`_preallocated`): storing a measurement
    into it gives it that measurement's provenance.
    """
    base = numpy.ndarray

    def __new__(cls: type, value: Any, provenance: Provenance | None = None) -> Any:
        array = numpy.asarray(value)
        if provenance is None:
            return array
        self = array.view(cls)
        self.provenance = provenance
        return self

    def __array_finalize__(self: Any, obj: Any) -> None:
        # a view, a copy or a slice of a tagged array: the same values, the same provenance
        self.provenance = getattr(obj, "provenance", None)
        self.filling = getattr(obj, "filling", False)

    def __array_ufunc__(self: Any, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        provenance = next(
            (each.provenance for each in inputs if isinstance(each, cls) and each.provenance),
            None,
        )
        plain = tuple(each.view(base) if isinstance(each, cls) else each for each in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(base) if isinstance(o, cls) else o for o in kwargs["out"])
        result = getattr(ufunc, method)(*plain, **kwargs)
        if provenance is None:
            return result
        if ufunc.__name__ not in _UNIT_KEEPING_UFUNCS or method != "__call__":
            numbers = [e for e in plain if isinstance(e, _NUMBER) and not isinstance(e, bool)]
            unit = None
            if ufunc.__name__ == "multiply" and len(numbers) == 1:
                unit = _scaled(provenance.unit, float(numbers[0]))
            elif ufunc.__name__ in ("divide", "true_divide") and plain[1:] == tuple(numbers):
                unit = _scaled(provenance.unit, 1 / float(numbers[0])) if numbers else None
            elif method == "reduce" and ufunc.__name__ in _UNIT_KEEPING_UFUNCS:
                unit = provenance.unit  # a sum, a maximum of times
            provenance = replace(provenance, unit=unit)
        if isinstance(result, tuple):
            return tuple(_tagged_result(each, provenance) for each in result)
        return _tagged_result(result, provenance)

    def __getitem__(self: Any, key: Any) -> Any:
        return _tagged_result(base.__getitem__(self, key), self.provenance)

    def __setitem__(self: Any, key: Any, value: Any) -> None:
        base.__setitem__(self, key, value)
        if not self.filling:
            return
        # timings[rep] = start.elapsed_time(end): an array the cell preallocated holds measurements
        # from then on, and so does the array a view of it (timings[rep][0] = ms) was taken from;
        # one it also stores another number into (res[i, 0] = loss, res[i, 1] = seconds) holds
        # both, and is compared as NumPy's own: its other numbers are no measurement
        measured = _measured_in(value)
        array = self
        while isinstance(array, cls) and array.filling:
            if measured is None:
                array.provenance, array.filling = None, False
            elif array.provenance is None:
                array.provenance = measured
            array = array.base

    def __iter__(self: Any) -> Any:
        return (self[index] for index in range(len(self)))

    def tolist(self: Any) -> Any:
        return tag(base.tolist(self.view(base)), self.provenance)

    def __reduce__(self: Any) -> Any:
        # any pickle but the workbench's transport (torch.save, pickle.dump) gets a plain array
        return base.__reduce__(self.view(base))

    def __repr__(self: Any) -> str:
        return repr(self.view(base))  # array([...]), as the cell's output shows a plain one

    def summary_method(name: str, keeps_unit: bool) -> Callable[..., Any]:
        method = getattr(base, name)

        def summarise(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(self.view(base), *args, **kwargs)
            provenance = self.provenance
            if provenance is not None and not keeps_unit:
                provenance = replace(provenance, unit=None)
            return _tagged_result(result, provenance)

        summarise.__name__ = name
        return summarise

    namespace: dict[str, Any] = {
        "__new__": __new__,
        "__array_finalize__": __array_finalize__,
        "__array_ufunc__": __array_ufunc__,
        "__getitem__": __getitem__,
        "__setitem__": __setitem__,
        "__iter__": __iter__,
        "tolist": tolist,
        "__reduce__": __reduce__,
        "__repr__": __repr__,
        "__module__": __name__,
        "__doc__": _tagged_array_type.__doc__,
        "provenance": None,
        #: an array the cell preallocated (np.zeros) that has held only measurements so far
        "filling": False,
        **{
            name: summary_method(name, keeps)
            for name, keeps in _ARRAY_SUMMARIES.items()
            if hasattr(base, name)  # (NumPy 2 has no ndarray.ptp)
        },
    }
    cls = type("TaggedArray", (base,), namespace)
    return cls


def _tagged_result(value: Any, provenance: Provenance | None) -> Any:
    """What a tagged array's operation gave, tagged: an array as one, a NumPy scalar as one."""
    if provenance is None:
        return value
    if isinstance(value, numpy.ndarray):
        return TaggedArray(value, provenance)
    return tag(value, provenance)


# ---- clock readings through datetime --------------------------------------------------------------

_PLAIN_DATETIME = datetime.datetime
_PLAIN_TIMEDELTA = datetime.timedelta


def _clock_provenance(*values: Any) -> Provenance | None:
    return next((p for p in map(provenance_of, values) if p is not None and p.measurement), None)


class MeasuredTimedelta(datetime.timedelta):
    """A ``timedelta`` between clock readings (``datetime.now() - start``): a measurement.

    Its seconds (``total_seconds()``, ``.seconds``) are tagged, and its texts noted.
    """

    provenance: Provenance | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        if len(args) == 2 and isinstance(args[0], _PLAIN_TIMEDELTA) and not kwargs:
            plain, provenance = args  # MeasuredTimedelta(td, provenance), as _rebuild makes one
            self = _PLAIN_TIMEDELTA.__new__(cls, plain.days, plain.seconds, plain.microseconds)
            self.provenance = provenance
            return self
        return _PLAIN_TIMEDELTA.__new__(cls, *args, **kwargs)

    def __reduce__(self) -> Any:  # any other pickle: a plain timedelta (torch.save, pickle)
        return _plain(self).__reduce__()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _plain(self).__reduce_ex__(protocol)

    def _seconds(self, value: Any) -> Any:
        prov = self.provenance
        return value if prov is None else tag(value, replace(prov, unit="s"))

    def total_seconds(self) -> Any:  # noqa: D102
        return self._seconds(_PLAIN_TIMEDELTA.total_seconds(self))

    @property
    def seconds(self) -> Any:  # noqa: D102
        return self._seconds(_PLAIN_TIMEDELTA.seconds.__get__(self))

    def __truediv__(self, other: Any) -> Any:
        # elapsed / timedelta(seconds=1): seconds; elapsed / steps: a timedelta, still measured
        result = _PLAIN_TIMEDELTA.__truediv__(self, other)
        if isinstance(result, float):
            return tag(result, self.provenance) if self.provenance is not None else result
        return _measured_delta(result, self.provenance)

    def __str__(self) -> str:
        return _noted(self, _PLAIN_TIMEDELTA.__str__(self))

    def __format__(self, spec: str) -> str:
        return _noted(self, _PLAIN_TIMEDELTA.__format__(self, spec))


def _measured_delta(result: Any, prov: Provenance | None) -> Any:
    if prov is None or type(result) is not _PLAIN_TIMEDELTA:
        return result
    return MeasuredTimedelta(result, prov)


class MeasuredDatetime(datetime.datetime):
    """``datetime.datetime`` as a run's cell sees it: the clock's readings are measurements.

    ``now()``, ``today()`` and ``utcnow()`` give a reading that remembers it came from the clock;
    the difference of two is a :class:`MeasuredTimedelta`, and the texts made of one
    (``strftime``, ``isoformat``, ``f"{now:%H:%M:%S}"``) are noted. A ``datetime`` the cell builds
    from its own numbers is no measurement.
    """

    provenance: Provenance | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        if len(args) == 2 and isinstance(args[0], _PLAIN_DATETIME) and not kwargs:
            plain, provenance = args  # as _rebuild makes one
            self = _PLAIN_DATETIME.__new__(
                cls, *plain.timetuple()[:6], plain.microsecond, plain.tzinfo, fold=plain.fold
            )
            self.provenance = provenance
            return self
        return _PLAIN_DATETIME.__new__(cls, *args, **kwargs)

    def __reduce__(self) -> Any:  # any other pickle: a plain datetime (torch.save, pickle)
        return _plain(self).__reduce__()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _plain(self).__reduce_ex__(protocol)

    @classmethod
    def now(cls, tz: Any = None) -> Any:  # noqa: D102
        return MeasuredDatetime(_PLAIN_DATETIME.now(tz), _DATETIME_SOURCES["now"])

    @classmethod
    def today(cls) -> Any:  # noqa: D102
        return MeasuredDatetime(_PLAIN_DATETIME.today(), _DATETIME_SOURCES["today"])

    @classmethod
    def utcnow(cls) -> Any:  # noqa: D102
        return MeasuredDatetime(_PLAIN_DATETIME.utcnow(), _DATETIME_SOURCES["utcnow"])

    def __sub__(self, other: Any) -> Any:
        result = _PLAIN_DATETIME.__sub__(_plain(self), _plain(other))
        if result is NotImplemented:
            return result
        prov = _clock_provenance(self, other)
        if isinstance(result, _PLAIN_DATETIME):  # now - timedelta(hours=1): still the clock's
            return result if prov is None else MeasuredDatetime(result, prov)
        return _measured_delta(result, prov)

    def __rsub__(self, other: Any) -> Any:
        if not isinstance(other, _PLAIN_DATETIME):
            return NotImplemented
        return _measured_delta(_plain(other) - _plain(self), _clock_provenance(self, other))

    def __add__(self, other: Any) -> Any:
        result = _PLAIN_DATETIME.__add__(_plain(self), other)
        if result is NotImplemented or self.provenance is None:
            return result
        return MeasuredDatetime(result, self.provenance)

    __radd__ = __add__

    def timestamp(self) -> Any:  # noqa: D102
        value = _PLAIN_DATETIME.timestamp(self)
        return value if self.provenance is None else tag(value, replace(self.provenance, unit="s"))

    def strftime(self, fmt: str) -> str:  # noqa: D102
        return _noted(self, _PLAIN_DATETIME.strftime(self, fmt))

    def isoformat(self, *args: Any, **kwargs: Any) -> str:  # noqa: D102
        return _noted(self, _PLAIN_DATETIME.isoformat(self, *args, **kwargs))

    def ctime(self) -> str:  # noqa: D102
        return _noted(self, _PLAIN_DATETIME.ctime(self))

    def __str__(self) -> str:
        return _noted(self, _PLAIN_DATETIME.__str__(self))

    def __format__(self, spec: str) -> str:
        return _noted(self, _PLAIN_DATETIME.__format__(self, spec))

    def __repr__(self) -> str:  # as the plain one reads: the notebook's class, by its name
        return repr(_plain(self))


_DATETIME_SOURCES = {
    name: Provenance("time", f"datetime.{name}") for name in ("now", "today", "utcnow")
}


class _DatetimeModule(types.ModuleType):
    """The ``datetime`` module as a run's cell names it: its ``datetime`` is the measured one."""

    def __init__(self, module: types.ModuleType) -> None:
        super().__init__(module.__name__, module.__doc__)
        self.__dict__.update(vars(module))
        self.datetime = MeasuredDatetime


#: ``time``'s functions that make a text of the current time when given at most so many arguments.
_CLOCK_TEXTS = {"strftime": 1, "ctime": 0, "asctime": 0}


def _clock_text(read: Callable[..., str], name: str, clock_args: int) -> Callable[..., str]:
    """``time.strftime``/``ctime``/``asctime`` whose text of the current time is a measurement's."""
    source = Provenance("time", f"time.{name}")

    @functools.wraps(read)
    def text(*args: Any) -> str:
        made = read(*args)
        return _noted_as(source, made) if len(args) <= clock_args else made

    return text


if numpy is not None:
    TaggedFloat64 = _tagged_numpy_scalar(numpy.float64)
    TaggedInt64 = _tagged_numpy_scalar(numpy.int64)
    TaggedArray = _tagged_array_type()
    #: NumPy's scalar types that summaries of measurements give, and their tagged subclasses.
    _NUMPY_TAGGED: dict[type, type] = {numpy.float64: TaggedFloat64, numpy.int64: TaggedInt64}
    #: The tagged types: what the workbench's transport pickles with the provenance.
    TAGGED: tuple[type, ...] = (
        TaggedFloat,
        TaggedInt,
        TaggedStr,
        TaggedFloat64,
        TaggedInt64,
        TaggedArray,
        MeasuredDatetime,
        MeasuredTimedelta,
    )
else:  # pragma: no cover - a torch without NumPy
    _NUMPY_TAGGED = {}
    TAGGED = (TaggedFloat, TaggedInt, TaggedStr, MeasuredDatetime, MeasuredTimedelta)
_NUMPY_PLAIN = {tagged: plain for plain, tagged in _NUMPY_TAGGED.items()}
#: The numbers tagged arithmetic takes and makes: Python's, and NumPy's that summaries give.
_NUMERIC: tuple[type, ...] = (*_NUMBER, *_NUMPY_TAGGED)


# ---- tensor to Python scalar: the one interception point ------------------------------------------

_observers: list[Callable[[torch.Tensor, Any, str], None]] = []
_BASE = torch._C.TensorBase
#: The tensor methods that make Python scalars, as a torch function mode sees them, and their names.
SCALAR_CONVERSIONS: dict[Any, str] = {
    _BASE.item: "Tensor.item",
    _BASE.__float__: "float",
    _BASE.__int__: "int",
    _BASE.tolist: "Tensor.tolist",
}


def scalar_from_tensor(tensor: torch.Tensor, value: Any, how: str) -> Any:
    """Every tensor to Python scalar conversion of a run passes here; returns the value to hand out.

    Parameters
    ----------
    tensor : Tensor
        The tensor converted.
    value : object
        What the conversion produced (a number, or nested lists of numbers for ``tolist``).
    how : str
        ``Tensor.item``, ``float``, ``int`` or ``Tensor.tolist``.

    Returns
    -------
    object
        ``value`` tagged with the tensor's dtype (:func:`source_dtype` reads it back). Observers
        registered with :func:`observe_scalars` see each conversion first, in order.
    """
    for observer in _observers:
        observer(tensor, value, how)
    dtype = str(tensor.dtype).removeprefix("torch.")
    return tag(value, Provenance("tensor", how, dtype=dtype))


@contextlib.contextmanager
def observe_scalars(observer: Callable[[torch.Tensor, Any, str], None]) -> Iterator[None]:
    """Call ``observer(tensor, value, how)`` for every scalar a run materialises."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def materialise(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one of :data:`SCALAR_CONVERSIONS` for a run's torch function mode, through the hook.

    ``float(t)`` and ``int(t)`` are observed but hand out plain values: Python turns a subclass
    returned by ``__float__``/``__int__`` back into a plain number (with a DeprecationWarning).
    ``.tolist()`` of more than :data:`SMALL_TOLIST` elements is a data dump, not a logged value,
    and is left alone. Under ``torch.compile`` tracing the call is Dynamo's own.
    """
    value = func(*args, **kwargs)
    if torch.compiler.is_compiling():
        return value
    how = SCALAR_CONVERSIONS[func]
    tensor = args[0]
    if how == "Tensor.tolist" and tensor.numel() > SMALL_TOLIST:
        return value
    if user_site(2) is None:
        # torch's own conversion (an optimizer's step count, read each step): nobody's value to
        # observe or compare, and plain floats keep torch's arithmetic on them fast
        return value
    tagged = scalar_from_tensor(tensor, value, how)
    return value if how in ("float", "int") else tagged


# ---- measurement sources -----------------------------------------------------------------------

_TIMERS = {
    name: ("ns" if name.endswith("_ns") else "s")
    for name in (
        "perf_counter",
        "perf_counter_ns",
        "time",
        "time_ns",
        "monotonic",
        "monotonic_ns",
        "process_time",
        "process_time_ns",
        "thread_time",
        "thread_time_ns",
    )
}
#: ``torch.cuda`` functions whose results are measurements: kind and unit.
CUDA_SOURCES = {
    "memory_allocated": ("memory", "B"),
    "max_memory_allocated": ("memory", "B"),
    "memory_reserved": ("memory", "B"),
    "max_memory_reserved": ("memory", "B"),
    "memory_stats": ("memory", None),
    "mem_get_info": ("memory", "B"),
    "memory_summary": ("memory", None),
    "get_device_properties": ("device", None),
    "get_device_name": ("device", None),
    "get_device_capability": ("device", None),
}


def _timer(name: str, unit: str) -> Callable[[], Any]:
    return _timer_over(getattr(time, name), name, unit)


#: The timers themselves, as importing this module found them: a notebook's own names for them.
_TIMER_FUNCTIONS = {
    getattr(time, name): (name, unit) for name, unit in _TIMERS.items() if hasattr(time, name)
}


def _tagged_timer(value: Any) -> Callable[[], Any] | None:
    """The tagged timer standing in for ``value`` when it is one of ``time``'s timers, else None."""
    try:
        timer = _TIMER_FUNCTIONS.get(value)
    except TypeError:  # an unhashable value: no timer
        return None
    return _timer_over(value, *timer) if timer is not None else None


@contextlib.contextmanager
def timers_named_in(namespace: MutableMapping[str, Any]) -> Iterator[None]:
    """For the body: the namespace's own names for the timers hand out tagged values too.

    ``from timeit import default_timer as timer`` (a popular PyTorch course's idiom) and ``from time
    import perf_counter`` bind the timer itself before the run, which :func:`tracked` replacing
    ``time``'s attributes does not reach: its times were compared, and failed the cell. Each such
    name gets the tagged timer for the run (so do the notebook's functions reading it there), and
    its own function back afterwards unless the cell bound it to something else.

    Likewise a name for ``datetime.datetime`` or the ``datetime`` module gets
    :class:`MeasuredDatetime` (``elapsed = (datetime.now() - start).total_seconds()``). The module's
    own attribute is left alone: libraries pickle and check plain datetimes against it, so a cell
    that imports ``datetime`` itself reads the plain clock (a documented limit).
    """
    with names_rebound(namespace, _measured_meaning):
        yield


def _measured_meaning(name: str, value: Any) -> Any:
    """What a notebook name for a timer or for ``datetime`` means during a run."""
    if value is _PLAIN_DATETIME:  # from datetime import datetime: its now() reads the clock
        return MeasuredDatetime
    if value is datetime:  # import datetime: datetime.datetime.now()
        return _DatetimeModule(value)
    if type(value) is not types.BuiltinFunctionType:  # (no hashing of the notebook's objects)
        return value
    tagged = _tagged_timer(value)
    return value if tagged is None else tagged


@functools.lru_cache(maxsize=64)
def _timer_over(original: Callable[[], Any], name: str, unit: str) -> Callable[[], Any]:
    """``original`` (``time.<name>``) giving tagged values; made once per function (every run)."""
    prov = Provenance("time", f"time.{name}", unit)
    kind = TaggedInt if unit == "ns" else TaggedFloat

    def timer() -> Any:
        return kind(original(), prov)

    timer.__name__ = name
    timer.__doc__ = original.__doc__
    return timer


class TaggedProperties:
    """A device-properties object whose numbers and strings are tagged as device measurements."""

    def __init__(self, properties: Any, source: str) -> None:
        self._properties = properties
        self._source = source

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # its own fields, and pickle's probes, while being rebuilt
            raise AttributeError(name)
        value = getattr(self._properties, name)
        unit = "B" if name.endswith("memory") else None
        return tag(value, Provenance("device", f"{self._source}().{name}", unit))

    def __repr__(self) -> str:
        return repr(self._properties)


def _measured(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    kind, unit = CUDA_SOURCES[name]
    prov = Provenance(kind, f"torch.cuda.{name}", unit)

    def measured(*args: Any, **kwargs: Any) -> Any:
        value = func(*args, **kwargs)
        tagged = tag(value, prov)
        if tagged is value and name == "get_device_properties":
            return TaggedProperties(value, prov.source)
        return tagged

    measured.__name__ = name
    measured.__doc__ = getattr(func, "__doc__", None)
    return measured


def cuda_replacements(cuda: Any) -> dict[str, Any]:
    """Replacements for ``cuda``'s (``torch.cuda`` or the run's shim of it) measurement sources.

    The shim's ``Event`` tags its own ``elapsed_time``; a real CUDA ``Event`` gets a subclass that
    does.
    """
    replacements: dict[str, Any] = {}
    for name in CUDA_SOURCES:
        func = getattr(cuda, name, None)
        if callable(func):
            replacements[name] = _measured(func, name)
    event = getattr(cuda, "Event", None)
    if isinstance(event, type) and not getattr(event, "tags_elapsed_time", False):
        replacements["Event"] = type(
            "Event", (event,), {"elapsed_time": _tagged_elapsed(event.elapsed_time)}
        )
    return replacements


def _tagged_elapsed(elapsed: Callable[..., float]) -> Callable[..., Any]:
    def elapsed_time(self: Any, end_event: Any) -> Any:
        return elapsed_ms(elapsed(self, end_event))

    return elapsed_time


def _tagged_table(table: Callable[..., str]) -> Callable[..., Any]:
    prov = Provenance("time", "torch.profiler EventList.table")

    def tagged(self: Any, *args: Any, **kwargs: Any) -> Any:
        return TaggedStr(table(self, *args, **kwargs), prov)

    tagged.__name__ = "table"
    tagged.__doc__ = table.__doc__
    return tagged


def _tagged_interval(init: Callable[..., None]) -> Callable[..., None]:
    prov = Provenance("time", "torch.profiler event time", "us")

    def tagged(self: Any, start: Any, end: Any) -> None:
        init(self, tag(start, prov), tag(end, prov))

    return tagged


def elapsed_ms(value: float) -> TaggedFloat:
    """``Event.elapsed_time``'s milliseconds, tagged as a time measurement."""
    return TaggedFloat(value, Provenance("time", "torch.cuda.Event.elapsed_time", "ms"))


# ---- summaries of measurements ----------------------------------------------------------------

#: Functions that summarise a sequence of numbers, by module: a summary of measurements is one
#: (the mean of a list of step times differs between any two runs as the times do). True: the
#: result is in the numbers' unit (a mean or a percentile of times is a time); False: it is not
#: (a variance is in the unit squared).
SUMMARIES: dict[str, dict[str, bool]] = {
    "statistics": {
        **dict.fromkeys(
            (
                "mean",
                "fmean",
                "geometric_mean",
                "harmonic_mean",
                "median",
                "median_low",
                "median_high",
                "median_grouped",
                "mode",
                "stdev",
                "pstdev",
                "quantiles",
            ),
            True,
        ),
        "variance": False,
        "pvariance": False,
    },
    "math": {"fsum": True},
    "numpy": {
        **dict.fromkeys(
            (
                "mean",
                "average",
                "median",
                "std",
                "min",
                "max",
                "amin",
                "amax",
                "sum",
                "ptp",
                "percentile",
                "quantile",
                "nanmean",
                "nanmedian",
                "nanstd",
                "nanmin",
                "nanmax",
                "nansum",
                "nanpercentile",
                "nanquantile",
            ),
            True,
        ),
        "var": False,
        "nanvar": False,
    },
}
#: How many items of a sequence are looked at for a measurement (a list of timings holds only
#: them; a long list of anything else is not walked to the end on every call).
_SUMMARY_LOOK = 1024


def _measured_in(data: Any) -> Provenance | None:
    """The provenance of the first measurement ``data`` is or holds (a list of timings), or None."""
    if is_measurement(data):
        return provenance_of(data)
    if type(data) in (list, tuple, collections.deque):
        for item in itertools.islice(data, _SUMMARY_LOOK):
            if is_measurement(item):
                return provenance_of(item)
    return None


@functools.lru_cache(maxsize=256)  # every run wraps the same functions: made once each
def _summary(func: Callable[..., Any], keeps_unit: bool, takes_iterators: bool) -> Any:
    @functools.wraps(func)
    def summary(*args: Any, **kwargs: Any) -> Any:
        if not args:
            return func(*args, **kwargs)
        data = args[0]
        if takes_iterators and isinstance(data, Iterator):
            # statistics and fsum read any iterable once: read here, and given on as a list
            data = list(data)
            args = (data, *args[1:])
        prov = _measured_in(data)
        result = func(*args, **kwargs)
        if prov is None:
            return result
        return tag(result, prov if keeps_unit else replace(prov, unit=None))

    return summary


def _summary_patches() -> list[tuple[Any, dict[str, Any]]]:
    """The summarising functions of the loaded modules of :data:`SUMMARIES`, wrapped to tag."""
    patches = []
    for module_name, functions in SUMMARIES.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        replacements = {
            name: _summary(getattr(module, name), keeps_unit, module_name != "numpy")
            for name, keeps_unit in functions.items()
            if callable(getattr(module, name, None))
        }
        patches.append((module, replacements))
    return patches


@contextlib.contextmanager
def tracked(cuda: Any) -> Iterator[MeasuredForms]:
    """For the body: timers and ``cuda``'s statistics hand out tagged values.

    ``cuda`` is what ``torch.cuda`` resolves to during the run (the run's shim, or the real module
    on a CUDA backend). Everything is put back on exit. Tensor scalars are tagged by the run's
    torch function mode, through :func:`materialise`.

    Yields what the body makes of its measurements that no longer carries their provenance (the
    texts and the float values: :class:`MeasuredForms`), filled as it runs.
    """
    from torch.autograd.profiler_util import EventList, Interval

    timers = {name: _timer(name, unit) for name, unit in _TIMERS.items() if hasattr(time, name)}
    # time.strftime("%H:%M:%S"), time.ctime(): texts of the clock's reading (not of a time given)
    timers.update(
        {name: _clock_text(getattr(time, name), name, args) for name, args in _CLOCK_TEXTS.items()}
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched_attributes(time, timers))
        if "timeit" in sys.modules:
            stack.enter_context(_timeit_tagged(sys.modules["timeit"]))
        stack.enter_context(_benchmark_tagged())
        # a profile's times and its table of them differ between any two runs (every event time,
        # its totals and averages, is made from an event's interval)
        table = vars(EventList)["table"]
        stack.enter_context(patched_attributes(EventList, {"table": _tagged_table(table)}))
        interval = vars(Interval)["__init__"]
        stack.enter_context(patched_attributes(Interval, {"__init__": _tagged_interval(interval)}))
        stack.enter_context(patched_attributes(cuda, cuda_replacements(cuda)))
        # np.mean(times), statistics.median(times): summaries of measurements are measurements
        for module, replacements in _summary_patches():
            stack.enter_context(patched_attributes(module, replacements))
        # np.array(times): an array of measurements is one, and so is what NumPy computes from it
        if "numpy" in sys.modules and numpy is not None:
            constructors = {name: _array_of(getattr(numpy, name)) for name in _ARRAY_CONSTRUCTORS}
            # timings = np.zeros(reps); timings[rep] = ms: a buffer filled with measurements is one
            constructors.update(
                {name: _preallocated(getattr(numpy, name)) for name in _PREALLOCATING}
            )
            stack.enter_context(patched_attributes(numpy, constructors))
        forms = MeasuredForms()
        _MEASURED.append(forms)
        stack.callback(_forget_forms, forms)
        yield forms


def _forget_forms(forms: MeasuredForms) -> None:
    """Stop noting into ``forms`` (by identity: another run's may be equal to it)."""
    for i, each in enumerate(_MEASURED):
        if each is forms:
            del _MEASURED[i]
            return


#: NumPy's functions that make an array of the numbers they are given.
_ARRAY_CONSTRUCTORS = ("array", "asarray", "asanyarray")


@functools.lru_cache(maxsize=16)
def _array_of(make: Callable[..., Any]) -> Callable[..., Any]:
    """``make`` (``np.array``), giving a tagged array for a sequence of measurements.

    Only the sequence's first item is looked at (a list of timings holds nothing else): NumPy makes
    arrays of long lists in loops, which a look through each would slow down.
    """

    @functools.wraps(make)
    def array(*args: Any, **kwargs: Any) -> Any:
        result = make(*args, **kwargs)
        if not args or not isinstance(result, numpy.ndarray):
            return result
        data = args[0]
        if type(data) in (list, tuple) and data:
            data = data[0]
        prov = provenance_of(data)
        if prov is None or not prov.measurement:
            return result
        return tag(result, prov)

    return array


@contextlib.contextmanager
def _timeit_tagged(timeit: Any) -> Iterator[None]:
    """``timeit``'s times are measurements: ``default_timer()``, ``timeit.timeit(...)``, ``repeat``.

    Both hold ``time.perf_counter`` as it was when ``timeit`` was imported (the module's
    ``default_timer``, and the default timer of every ``timeit.Timer``), which replacing ``time``'s
    attributes does not reach. A ``Timer`` made during the run with one of ``time``'s timers times
    with its tagged stand-in, so what ``timeit``, ``repeat`` and ``autorange`` return is tagged.
    """
    init = vars(timeit.Timer)["__init__"]

    def timer_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.timer = _tagged_timer(self.timer) or self.timer

    replacements: dict[str, Any] = {}
    default = _tagged_timer(getattr(timeit, "default_timer", None))
    if default is not None:
        replacements["default_timer"] = default
    with (
        patched_attributes(timeit, replacements),
        patched_attributes(timeit.Timer, {"__init__": timer_init}),
    ):
        yield


#: What ``torch.utils.benchmark`` chose by timing the statement: how many runs make a block.
_BLOCK_SIZE = Provenance("time", "torch.utils.benchmark.Timer.blocked_autorange")


@contextlib.contextmanager
def _benchmark_tagged() -> Iterator[None]:
    """``torch.utils.benchmark``'s results are measurements where its times are.

    Its timer reads ``timeit.default_timer()`` (tagged by :func:`_timeit_tagged`), but a
    ``Measurement`` computes its median, mean and quartiles through a float64 tensor of its times,
    which keeps no provenance (``m.median * 1e6`` was compared and failed the cell), and
    ``blocked_autorange`` and ``adaptive_autorange`` choose the runs per block by timing the
    statement (``m.number_per_run`` differs between two machines). Those are tagged too.
    """
    common = sys.modules.get("torch.utils.benchmark.utils.common")
    timer_module = sys.modules.get("torch.utils.benchmark.utils.timer")
    # (torch's private methods: a torch without them leaves its results untagged, never failing)
    lazy_init = vars(getattr(common, "Measurement", object)).get("_lazy_init")
    estimate = vars(getattr(timer_module, "Timer", object)).get("_estimate_block_size")
    if lazy_init is None or estimate is None:  # not imported: nothing to tag
        yield
        return

    def statistics_tagged(self: Any) -> None:
        lazy_init(self)
        measured = _measured_in(self.raw_times)
        if measured is None:
            return
        for name in ("_median", "_mean", "_p25", "_p75"):  # seconds per run, as the times
            setattr(self, name, tag(_plain(getattr(self, name)), measured))

    def block_size_tagged(self: Any, min_run_time: float) -> Any:
        return tag(estimate(self, min_run_time), _BLOCK_SIZE)

    with (
        patched_attributes(common.Measurement, {"_lazy_init": statistics_tagged}),
        patched_attributes(timer_module.Timer, {"_estimate_block_size": block_size_tagged}),
    ):
        yield


#: NumPy's functions that make a buffer for the numbers the cell then stores into it.
_PREALLOCATING = ("zeros", "empty", "ones", "full")


@functools.lru_cache(maxsize=16)
def _preallocated(make: Callable[..., Any]) -> Callable[..., Any]:
    """``make`` (``np.zeros``), giving the cell's own code an array that notes measurements stored.

    The benchmark idiom ``timings = np.zeros((reps, 1))`` then ``timings[rep] =
    starter.elapsed_time(ender)`` fills a plain array, which kept nothing of where its numbers came
    from: the timings, and ``np.std(timings)``, were compared and failed the cell. Only the cell's
    code (and the notebook functions it calls, whose module is ``__main__`` too) gets such an
    array: a library making its buffers gets NumPy's own type.
    """

    @functools.wraps(make)
    def preallocate(*args: Any, **kwargs: Any) -> Any:
        result = make(*args, **kwargs)
        if (
            type(result) is numpy.ndarray
            and result.dtype.kind in "biuf"
            and sys._getframe(1).f_globals.get("__name__") == "__main__"
        ):
            buffer = result.view(TaggedArray)  # no provenance until a measurement is stored
            buffer.filling = True
            return buffer
        return result

    return preallocate


#: ``torch.cuda`` names whose answers on the cpu reference need its memory accounting.
MEMORY_STATISTICS = frozenset(
    name for name, (kind, _) in CUDA_SOURCES.items() if kind == "memory"
) | {"memory_summary", "reset_peak_memory_stats", "reset_max_memory_allocated"}


def reads_memory_statistics(program: Any, namespace: Any) -> bool:
    """Whether the cell, or a notebook function it reaches, names a CUDA memory statistic.

    A static test (like ``calls_backward``): the cpu reference keeps its memory accounting, which
    costs a little per op, only for such cells. A library that reads the statistics itself is not
    seen; its figures are then 0 on the reference.
    """
    from neuron_workbench.run.cell import _code_names, _user_functions, referenced_names

    if any(name in program.source for name in MEMORY_STATISTICS):
        return True
    for name in referenced_names(program, namespace):
        value = namespace.get(name)
        if _memory_statistic(value):
            return True
        for func in _user_functions(value, namespace):
            names = set(_code_names(func.__code__))
            if MEMORY_STATISTICS.intersection(names) or any(
                _memory_statistic(namespace.get(read)) for read in names
            ):
                return True
    return False


def _memory_statistic(value: Any) -> bool:
    """Whether ``value`` is one of ``torch.cuda``'s memory statistics, under whatever name.

    ``from torch.cuda import max_memory_allocated as peak_bytes``: the cell names no statistic.
    """
    return (
        type(value) is types.FunctionType
        and value.__name__ in MEMORY_STATISTICS
        and (value.__module__ or "").startswith("torch.cuda")
    )
