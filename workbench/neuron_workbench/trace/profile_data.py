"""The op profile of one run as data: per-op rows, JSON form, Chrome trace output.

What :func:`neuron_workbench.trace.profile.op_profiler` records, in the form the report embeds
(``ref.profile`` / ``target.profile``) and reads back. No torch here: reports and views load
profiles where only the JSON is at hand.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from neuron_workbench.opnames import normalize_op as base_op_name

if TYPE_CHECKING:
    import pandas

__all__ = [
    "HOST_CPU_TIME",
    "SYNCED_WALL_TIME",
    "WALL_TIME",
    "OpProfile",
    "OpStat",
    "as_profile",
    "combined_chrome_trace",
    "write_chrome_trace",
]

#: ``time_kind`` of emulated devices: the numbers are host CPU time, not device time.
HOST_CPU_TIME = "host CPU time"
#: ``time_kind`` of asynchronous devices timed with a synchronize after each op.
SYNCED_WALL_TIME = "device-synchronized wall time"
#: ``time_kind`` of the CPU (synchronous, nothing to wait for).
WALL_TIME = "wall time"


@dataclass
class OpStat:
    """One ATen op's totals in one run (all overloads of the op together).

    Attributes
    ----------
    op : str
        Base op name, e.g. ``aten::addmm``.
    calls : int
        Number of calls.
    total_time_s : float
        Time spent in the op, in seconds (see the profile's ``time_kind``).
    self_time_s : float
        Time in the op excluding nested recorded ops (equal to ``total_time_s`` for dispatch-level
        profiles, whose ops do not nest).
    shapes : str
        The most common input signature, ``"[32, 3, 32, 32] f32, [16, 3, 3, 3] f32"``, plus how
        many other signatures occurred.
    bytes_allocated : int
        Bytes of the fresh (non-view, non-in-place) tensors the op returned, summed over calls.
    fallback : bool or None
        Whether the op ran on the CPU instead of the device; None when unknown.
    overloads : list of str
        Overloads seen, e.g. ``["aten::add.Tensor"]``.
    site : dict or None
        First user source line that called the op (``file``, ``line``, ``function``); None when it
        was only called from backward or library code.
    module : str
        Qualified ``nn.Module`` path running at that first call (``""`` for none or the root).
    """

    op: str
    calls: int
    total_time_s: float
    self_time_s: float
    shapes: str = ""
    bytes_allocated: int = 0
    fallback: bool | None = None
    overloads: list[str] = field(default_factory=list)
    site: dict[str, Any] | None = None
    module: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "op": self.op,
            "calls": self.calls,
            "total_time_s": self.total_time_s,
            "self_time_s": self.self_time_s,
            "shapes": self.shapes,
            "bytes_allocated": self.bytes_allocated,
            "fallback": self.fallback,
            "overloads": list(self.overloads),
            "site": dict(self.site) if self.site else None,
            "module": self.module,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpStat:
        """Inverse of :meth:`to_dict`."""
        fallback = data.get("fallback")
        return cls(
            op=str(data["op"]),
            calls=int(data.get("calls", 0)),
            total_time_s=float(data.get("total_time_s", 0.0)),
            self_time_s=float(data.get("self_time_s", data.get("total_time_s", 0.0))),
            shapes=str(data.get("shapes", "")),
            bytes_allocated=int(data.get("bytes_allocated", 0)),
            fallback=None if fallback is None else bool(fallback),
            overloads=[str(o) for o in data.get("overloads", [])],
            site=dict(data["site"]) if data.get("site") else None,
            module=str(data.get("module", "")),
        )


def _rows_to_dicts(rows: list[OpStat] | None) -> list[dict[str, Any]] | None:
    return None if rows is None else [row.to_dict() for row in rows]


def _rows_from_dicts(rows: list[dict[str, Any]] | None) -> list[OpStat] | None:
    return None if rows is None else [OpStat.from_dict(row) for row in rows]


@dataclass
class OpProfile:
    """The op profile of one run on one backend.

    Attributes
    ----------
    backend : str
        Backend name (``cpu``, ``cuda``, ``neuron``, ``tpu``).
    time_kind : str
        What the times measure: ``"host CPU time"`` on emulated devices, ``"wall time"`` on the
        CPU, ``"device-synchronized wall time"`` on asynchronous devices.
    rows : list of OpStat
        Every op of the run (all steps), slowest first.
    first_call : list of OpStat or None
        With ``--steps N``: the ops of the first step (compile and warm-up). None otherwise.
    steady : list of OpStat or None
        With ``--steps N``: the ops of steps 2..N together (steady state). None otherwise.
    steps : int
        How many times the cell ran under the recorder.
    step_times_s : list of float
        Time of each step as seen by the recorder (same ``time_kind``).
    peak_memory_bytes : int or None
        The run's peak device memory (CUDA's or TorchNeuron's allocator statistics, or the
        emulator's accounting); None where the backend keeps none (the CPU).
    peak_memory_unavailable : str
        Why reading the peak failed (the backend's error), empty when it did not.
    emulated : bool
        True when the backend is the workbench's emulation.
    synchronized : bool
        True when each op was followed by a device synchronize.
    trace : dict
        Compact per-call events for :meth:`to_chrome_trace`: ``ops`` (names), ``events``
        (``[op_index, ts_us, dur_us, thread, step]``, ``step`` counting from 0), ``threads`` and ``dropped``.
    """

    backend: str
    time_kind: str
    rows: list[OpStat] = field(default_factory=list)
    first_call: list[OpStat] | None = None
    steady: list[OpStat] | None = None
    steps: int = 1
    step_times_s: list[float] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    peak_memory_unavailable: str = ""
    emulated: bool = False
    synchronized: bool = False
    trace: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def total_time_s(self) -> float:
        """Sum of the ops' self times."""
        return sum(row.self_time_s for row in self.rows)

    @property
    def bytes_allocated(self) -> int:
        """Sum of the bytes the ops allocated."""
        return sum(row.bytes_allocated for row in self.rows)

    def row(self, op: str) -> OpStat | None:
        """The row of ``op`` (``aten::sort`` or ``sort``), or None."""
        name = base_op_name(op)
        return next((row for row in self.rows if row.op == name), None)

    def mark_fallbacks(self, ops: Iterable[str]) -> OpProfile:
        """Set every row's ``fallback`` flag from the ops that fell back; returns ``self``."""
        fell_back = {base_op_name(op) for op in ops}
        for rows in (self.rows, self.first_call or [], self.steady or []):
            for row in rows:
                row.fallback = row.op in fell_back
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (embedded in the report as ``ref.profile`` / ``target.profile``)."""
        return {
            "backend": self.backend,
            "time_kind": self.time_kind,
            "emulated": self.emulated,
            "synchronized": self.synchronized,
            "steps": self.steps,
            "step_times_s": list(self.step_times_s),
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_unavailable": self.peak_memory_unavailable,
            "total_time_s": self.total_time_s,
            "bytes_allocated": self.bytes_allocated,
            "rows": _rows_to_dicts(self.rows),
            "first_call": _rows_to_dicts(self.first_call),
            "steady": _rows_to_dicts(self.steady),
            "trace": dict(self.trace),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpProfile:
        """Inverse of :meth:`to_dict`."""
        peak = data.get("peak_memory_bytes")
        return cls(
            backend=str(data.get("backend", "")),
            time_kind=str(data.get("time_kind", WALL_TIME)),
            rows=_rows_from_dicts(data.get("rows") or []) or [],
            first_call=_rows_from_dicts(data.get("first_call")),
            steady=_rows_from_dicts(data.get("steady")),
            # Reports of schema_version 1 name these "iterations" and "iteration_times_s".
            steps=int(data.get("steps", data.get("iterations", 1))),
            step_times_s=[
                float(t) for t in data.get("step_times_s", data.get("iteration_times_s", []))
            ],
            peak_memory_bytes=None if peak is None else int(peak),
            peak_memory_unavailable=str(data.get("peak_memory_unavailable", "")),
            emulated=bool(data.get("emulated", False)),
            synchronized=bool(data.get("synchronized", False)),
            trace=dict(data.get("trace") or {}),
        )

    def chrome_events(self, pid: int = 1) -> list[dict[str, Any]]:
        """The run's calls as Chrome trace events (``ph: "X"``) plus process/thread names."""
        label = f"{self.backend}{' (emulated)' if self.emulated else ''} — {self.time_kind}"
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}}
        ]
        threads = self.trace.get("threads", {})
        for tid, name in threads.items():
            events.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": int(tid),
                 "args": {"name": name}}
            )  # fmt: skip
        ops = self.trace.get("ops", [])
        for index, ts, dur, tid, step in self.trace.get("events", []):
            events.append(
                {
                    "name": base_op_name(ops[index]),
                    "cat": "op",
                    "ph": "X",
                    "ts": ts,
                    "dur": dur,
                    "pid": pid,
                    "tid": int(tid),
                    "args": {
                        "overload": ops[index],
                        "step": step,
                        "time_kind": self.time_kind,
                    },
                }
            )
        return events

    def to_chrome_trace(self) -> dict[str, Any]:
        """The run's calls in Chrome trace event format (opens in Perfetto and chrome://tracing)."""
        return {
            "traceEvents": self.chrome_events(pid=1),
            "displayTimeUnit": "ms",
            "otherData": {
                "backend": self.backend,
                "time_kind": self.time_kind,
                "dropped_events": int(self.trace.get("dropped", 0)),
            },
        }

    def dataframe(self, which: str = "rows") -> pandas.DataFrame:
        """The rows (or ``first_call`` / ``steady``) as a pandas DataFrame, slowest first."""
        import pandas as pd

        rows = getattr(self, which) or []
        columns = ["op", "calls", "total_time_s", "self_time_s", "shapes", "bytes_allocated",
                   "fallback"]  # fmt: skip
        return pd.DataFrame([{c: getattr(r, c) for c in columns} for r in rows], columns=columns)


def combined_chrome_trace(*profiles: OpProfile | dict[str, Any]) -> dict[str, Any]:
    """Several runs (e.g. reference and target) in one Chrome trace, one process each."""
    events: list[dict[str, Any]] = []
    for pid, profile in enumerate(profiles, start=1):
        events.extend(as_profile(profile).chrome_events(pid=pid))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def as_profile(value: OpProfile | dict[str, Any]) -> OpProfile:
    """``value`` itself, or the :class:`OpProfile` of its ``to_dict()`` form."""
    return value if isinstance(value, OpProfile) else OpProfile.from_dict(value)


def write_chrome_trace(path: str | os.PathLike[str], *profiles: OpProfile | dict[str, Any]) -> str:
    """Write one or more profiles as a Chrome trace JSON file; returns the path."""
    data = (
        as_profile(profiles[0]).to_chrome_trace()
        if len(profiles) == 1
        else combined_chrome_trace(*profiles)
    )
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    return os.fspath(path)
