"""What a run observed, step by step: every scalar the program materialised from a tensor.

A training script logs its loss with ``loss.item()``, its accuracy with ``int(correct)``, its grad
norm with ``float(norm)``; all of them pass :func:`~neuron_workbench.run.measurements.
scalar_from_tensor`. While a run records (the ``scalars`` instrument, :func:`scalar_instrument`),
each one is kept with its call site (``train.py:88``) and its order in the run, so two runs can be
aligned by call site and occurrence: the loss curve, with no change to the program.

Only calls made from the user's code count: the innermost frame outside the conversion hook must
be neither torch's (an optimizer's ``step.item()``) nor the workbench's (``--steps`` reading bound
scalars). Bounded: numbers only (``.tolist()`` of at most :data:`MAX_TOLIST` elements), the first
:data:`MAX_VALUES` occurrences per site and :data:`MAX_SITES` sites; beyond that only counts and a
summary (min, max, last) are kept. ``max_steps`` ends the run (:class:`StopRun`) when the first
call site seen is reached for the ``max_steps + 1``-th time.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from neuron_workbench.run import measurements
from neuron_workbench.run.scalar_sites import user_site
from neuron_workbench.sites import is_cell_filename

__all__ = [
    "MAX_SITES",
    "MAX_TOLIST",
    "MAX_VALUES",
    "ScalarRecorder",
    "ScalarSeries",
    "ScalarTrace",
    "StopRun",
    "scalar_instrument",
]

#: Occurrences kept per call site; later ones are counted and summarised.
MAX_VALUES = 5000
#: Call sites kept; scalars of later sites are counted only.
MAX_SITES = 64
#: ``.tolist()`` of more elements than this is not a logged value.
MAX_TOLIST = 16


class StopRun(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Ends a run early (``max_steps``); the executor treats it as the program's normal end.

    A ``BaseException`` so that a program's ``except Exception`` does not swallow it.
    """


@dataclass
class ScalarSeries:
    """The scalars one call site produced, in order.

    Attributes
    ----------
    site : str
        ``file:line`` of the call (the file's base name; a notebook cell's compiled name).
    how : str
        The conversion first seen there: ``Tensor.item``, ``float``, ``int``, ``Tensor.tolist``.
    dtype : str or None
        The dtype of the tensor first converted there.
    values : list
        The first :data:`MAX_VALUES` values (numbers, or short lists for ``tolist``).
    order : list of int
        Each kept value's position among all the run's recorded scalars (0-based).
    count : int
        Every occurrence, kept or not.
    dropped : dict
        ``min``, ``max``, ``last`` of the occurrences beyond :data:`MAX_VALUES` (empty if none).
    """

    site: str
    how: str
    dtype: str | None
    values: list[Any] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    count: int = 0
    dropped: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "site": self.site,
            "how": self.how,
            "dtype": self.dtype,
            "values": [_json_number(v) for v in self.values],
            "order": list(self.order),
            "count": self.count,
            "dropped": dict(self.dropped),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScalarSeries:
        """Inverse of :meth:`to_dict`."""
        return cls(
            site=str(data["site"]),
            how=str(data.get("how", "")),
            dtype=data.get("dtype"),
            values=[_from_json(v) for v in data.get("values", [])],
            order=[int(i) for i in data.get("order", [])],
            count=int(data.get("count", 0)),
            dropped=dict(data.get("dropped") or {}),
        )


@dataclass
class ScalarTrace:
    """Every call site's scalars in one run (the ``scalars`` instrument's result).

    Attributes
    ----------
    series : dict of str to ScalarSeries
        By call site, in the order the sites were first seen.
    total : int
        Scalars recorded (every occurrence at every site).
    unrecorded : int
        Scalars of sites beyond :data:`MAX_SITES` (counted only).
    max_steps : int or None
        The limit the run had; ``stopped`` is True when it ended the run.
    """

    series: dict[str, ScalarSeries] = field(default_factory=dict)
    total: int = 0
    unrecorded: int = 0
    max_steps: int | None = None
    stopped: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "series": [s.to_dict() for s in self.series.values()],
            "total": self.total,
            "unrecorded": self.unrecorded,
            "max_steps": self.max_steps,
            "stopped": self.stopped,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScalarTrace:
        """Inverse of :meth:`to_dict`."""
        series = [ScalarSeries.from_dict(s) for s in data.get("series", [])]
        return cls(
            series={s.site: s for s in series},
            total=int(data.get("total", 0)),
            unrecorded=int(data.get("unrecorded", 0)),
            max_steps=data.get("max_steps"),
            stopped=bool(data.get("stopped", False)),
        )


def _json_number(value: Any) -> Any:
    if isinstance(value, list):
        return [_json_number(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf": JSON has no literal for them
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, str):
        return float(value)
    return value


def _plain(value: Any) -> Any:
    """A plain number (or flat list of them); None for what is not a logged scalar."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, list):
        flat: list[Any] = []
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(reversed(item))
            else:
                flat.append(_plain(item))
        return flat if len(flat) <= MAX_TOLIST and None not in flat else None
    return None


class ScalarRecorder:
    """Records a run's scalars while active (a run instrument; see :func:`scalar_instrument`)."""

    def __init__(self, max_steps: int | None = None, cell_file: str | None = None) -> None:
        self._trace = ScalarTrace(max_steps=max_steps)
        self._first: str | None = None
        self._cell_prefix = f"{cell_file}:" if cell_file else None

    def result(self) -> ScalarTrace:
        """What was recorded."""
        return self._trace

    def observe(self, tensor: torch.Tensor, value: Any, how: str) -> None:
        """The hook's observer: keep ``value`` when the user's code made it."""
        if torch.compiler.is_compiling():
            return
        site = user_site(3)  # our caller is scalar_from_tensor
        if site is None:
            return
        if self._cell_prefix is not None and site.startswith(self._cell_prefix):
            # the running cell's own lines: its pseudo-file's number counts the cells this kernel
            # compiled, which two sessions recording the same cell do not share
            site = "cell:" + site[len(self._cell_prefix) :]
        plain = _plain(value)
        if plain is None:
            return
        trace = self._trace
        series = trace.series.get(site)
        if self._first is None:
            self._first = site
        if site == self._first and trace.max_steps is not None and series is not None:
            if series.count >= trace.max_steps:
                trace.stopped = True
                raise StopRun(f"stopped after {trace.max_steps} steps")
        if series is None:
            if len(trace.series) >= MAX_SITES:
                trace.unrecorded += 1
                return
            dtype = str(tensor.dtype).removeprefix("torch.")
            series = trace.series[site] = ScalarSeries(site, how, dtype)
        series.count += 1
        if len(series.values) < MAX_VALUES:
            series.values.append(plain)
            series.order.append(trace.total)
        elif not isinstance(plain, list):
            dropped = series.dropped
            number = float(plain)
            dropped["min"] = min(dropped.get("min", number), number)
            dropped["max"] = max(dropped.get("max", number), number)
            dropped["last"] = number
        trace.total += 1


@dataclass(frozen=True)
class ScalarInstrument:
    """A run instrument recording :class:`ScalarTrace` (picklable: it travels to a worker)."""

    max_steps: int | None = None
    #: the notebook cell's pseudo-file (``<neuron-cell-3>``), whose sites read ``cell:LINE``
    cell_file: str | None = None

    @contextlib.contextmanager
    def __call__(self, backend: Any) -> Iterator[ScalarRecorder]:
        """Record for the length of the run."""
        recorder = ScalarRecorder(self.max_steps, self.cell_file)
        with measurements.observe_scalars(recorder.observe):
            yield recorder


def scalar_instrument(max_steps: int | None = None, filename: str = "") -> ScalarInstrument:
    """The ``scalars`` run instrument; ``max_steps`` stops the run (see the module docstring).

    ``filename`` is the program's: a notebook cell's pseudo-file (``<neuron-cell-3>``, numbered by
    the cells its kernel compiled) gives its own sites as ``cell:LINE``, so one cell recorded in
    two sessions has the same sites; a script's stay ``train.py:LINE``.
    """
    return ScalarInstrument(max_steps, filename if is_cell_filename(filename) else None)
